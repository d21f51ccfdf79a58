//! Every way a write can end, decided without a network (the client asks; this decides).
use super::*;
use ferry_shared::api::{InvalidationStatus, Position};

fn answer(status: u16, body: &[u8]) -> Exchange {
    Ok((status, None, body.to_vec()))
}

const UNKNOWN: &[u8] = br#"{"error": {"code": "outcome_unknown", "message": "ask"}}"#;

fn outcome(committed: bool) -> OutcomeResponse {
    OutcomeResponse {
        committed,
        rows_affected: committed.then_some(2),
        invalidation: if committed {
            InvalidationStatus::Done
        } else {
            InvalidationStatus::None
        },
        position: committed.then_some(Position(0x3000148)),
    }
}

#[test]
fn a_write_asks_its_outcome_when_nobody_knows_it() {
    assert!(ask_outcome(&answer(503, UNKNOWN)));
    assert!(ask_outcome(&Err(EdgeError::Unreachable)));
    assert!(ask_outcome(&answer(502, b"<html>502 Bad Gateway</html>")));
    // A sidecar that knows the write failed, or that it never reached Postgres: it stands.
    let down = br#"{"error": {"code": "database_unavailable", "message": "down"}}"#;
    assert!(!ask_outcome(&answer(503, down)));
    assert!(!ask_outcome(&answer(200, b"{}")));
    assert!(!ask_outcome(&Err(EdgeError::Timeout { after_ms: 100 })));
}

#[test]
fn a_committed_outcome_is_each_writes_answer() {
    let lost = || Err(EdgeError::Unreachable);
    assert_eq!(
        settle(lost(), Some(outcome(true)), executed),
        Ok(ExecuteResponse {
            rows_affected: 2,
            invalidation: InvalidationStatus::Done,
            position: Some(Position(0x3000148)),
        })
    );
    assert_eq!(
        settle(answer(503, UNKNOWN), Some(outcome(true)), ended),
        Ok(EndResponse {
            committed: true,
            invalidation: InvalidationStatus::Done,
            position: Some(Position(0x3000148)),
        })
    );
    // A transaction's results are not in its outcome: it says it committed, never "retry".
    let t = settle(lost(), Some(outcome(true)), transacted).expect_err("no results to give");
    assert_eq!(
        t,
        EdgeError::CommittedWithoutResults {
            rows_affected: 2,
            invalidation: InvalidationStatus::Done,
            position: Some(Position(0x3000148)),
        }
    );
    assert_eq!(t.code(), ErrorCode::CommittedResultsLost);
    assert_eq!(t.retry_after(), None);
}

#[test]
fn otherwise_the_writes_own_answer_stands() {
    // Not committed (and now never will): the error the write got, retryable as it says.
    let e = settle(
        Err(EdgeError::Unreachable),
        Some(outcome(false)),
        transacted,
    );
    assert_eq!(e, Err(EdgeError::Unreachable));
    // Nobody could be asked: the sidecar's own outcome_unknown goes to the caller.
    let e = settle(answer(503, UNKNOWN), None, ended).expect_err("unknown");
    assert_eq!(e.code(), ErrorCode::OutcomeUnknown);
    // Answered: the answer, whatever an outcome would have said.
    let body = br#"{"results": [{"rows_affected": 1, "rows": []}], "invalidation": "none"}"#;
    let ok = settle(answer(200, body), None, transacted).expect("answered");
    assert_eq!(ok.results.len(), 1);
    let refused = br#"{"error": {"code": "transaction_aborted", "message": "no", "statement": 1}}"#;
    let e = settle(answer(409, refused), None, transacted).expect_err("refused");
    assert_eq!(e.body().error.statement, Some(1));
}

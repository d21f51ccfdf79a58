//! A write whose answer was lost: when to ask a sidecar whether it committed
//! (`POST /v1/outcome`, by the nonce it was signed with), and what the caller is told then.
//! Every write the client sends ends here: `/v1/execute`, `/v1/transaction` and an interactive
//! transaction's commit. Pure, so every way a write can end is tested natively; the client
//! (`SidecarClient::write`, wasm32) does the asking.

use crate::client::{interpret, read_again, Exchange};
use crate::error::EdgeError;
use ferry_shared::api::{EndResponse, ExecuteResponse, OutcomeResponse, TransactionResponse};
use ferry_shared::{ErrorBody, ErrorCode};

/// Whether a write's outcome must be asked of a sidecar: no sidecar answered it
/// ([`read_again`]), or the sidecar lost Postgres during the write's COMMIT and could not ask
/// it (503 `outcome_unknown`). Never after the edge's own timeout: the write may still be
/// running, and asking would wait for it.
pub fn ask_outcome(sent: &Exchange) -> bool {
    read_again(sent)
        || matches!(sent, Ok((503, _, body))
            if serde_json::from_slice::<ErrorBody>(body)
                .is_ok_and(|b| b.error.code == ErrorCode::OutcomeUnknown))
}

/// How a write ends. A committed outcome (`asked`) is the answer, through `committed`; any
/// other way, the write's own answer or error stands. When a sidecar did answer the outcome
/// (`asked` is `Some`, not committed), that error is final: the write never will commit.
pub fn settle<T: serde::de::DeserializeOwned>(
    sent: Exchange,
    asked: Option<OutcomeResponse>,
    committed: fn(OutcomeResponse) -> Result<T, EdgeError>,
) -> Result<T, EdgeError> {
    if let Some(o) = asked.filter(|o| o.committed) {
        return committed(o);
    }
    let (status, retry_after, bytes) = sent?;
    interpret(status, retry_after, &bytes)
}

/// A committed `/v1/execute`: the outcome holds all of its answer.
pub fn executed(o: OutcomeResponse) -> Result<ExecuteResponse, EdgeError> {
    Ok(ExecuteResponse {
        rows_affected: o.rows_affected.unwrap_or(0),
        invalidation: o.invalidation,
        position: o.position,
    })
}

/// A committed interactive transaction: its commit's whole answer.
pub fn ended(o: OutcomeResponse) -> Result<EndResponse, EdgeError> {
    Ok(EndResponse {
        committed: true,
        invalidation: o.invalidation,
        position: o.position,
    })
}

/// A committed `/v1/transaction`: its per-statement results (rows, RETURNING) were lost with
/// its sidecar and are not in the outcome, so it cannot be answered as a success; it is
/// answered as what it is, a commit without results, so nobody sends it again.
pub fn transacted(o: OutcomeResponse) -> Result<TransactionResponse, EdgeError> {
    Err(EdgeError::CommittedWithoutResults {
        rows_affected: o.rows_affected.unwrap_or(0),
        invalidation: o.invalidation,
        position: o.position,
    })
}

#[cfg(test)]
#[path = "outcome_tests.rs"]
mod tests;

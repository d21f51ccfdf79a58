//! The pure parts of the sidecar client: signing, answers, and when a call goes again.
use super::*;
use ferry_shared::api::QueryResponse;
use serde_json::json;

fn cfg() -> EdgeConfig {
    EdgeConfig {
        sidecar_url: "http://127.0.0.1:8787".into(),
        timeout_ms: 100,
        secret: "0123456789abcdef".into(),
    }
}

#[test]
fn calls_are_signed_so_the_sidecar_verifies_them() {
    let body = json!({"sql": "SELECT 1"});
    let call = build_call(
        &cfg(),
        "POST",
        "/v1/query",
        Some(&body),
        1000,
        "00ff00ff00ff00ff",
    )
    .expect("builds");
    assert_eq!(call.url, "http://127.0.0.1:8787/v1/query");
    let h = |name: &str| {
        call.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    };
    let headers = sign::parse_headers(
        h(sign::HEADER_TIMESTAMP).as_deref(),
        h(sign::HEADER_NONCE).as_deref(),
        h(sign::HEADER_SIGNATURE).as_deref(),
    )
    .expect("all three headers");
    let signed = sign::SignedRequest {
        headers: &headers,
        method: "POST",
        path_and_query: "/v1/query",
        body: &call.body,
    };
    let verified = sign::verify(&[b"0123456789abcdef"], &signed, 1000, 300);
    assert!(verified.is_ok());
}

#[test]
fn answers_are_mapped() {
    let ok: Result<QueryResponse, _> = interpret(
        200,
        None,
        br#"{"rows": [], "cache": "hit", "age_ms": 3, "future_field": 1}"#,
    );
    assert_eq!(ok.map(|r| r.age_ms), Ok(3));

    let bad: Result<QueryResponse, _> = interpret(200, None, b"<html>");
    assert_eq!(bad, Err(EdgeError::BadResponse { status: 200 }));

    let auth: Result<QueryResponse, _> = interpret(
        401,
        None,
        br#"{"error": {"code": "auth_bad_signature", "message": "signature does not match"}}"#,
    );
    assert_eq!(auth, Err(EdgeError::AuthFailed));

    let sql: Result<QueryResponse, _> = interpret(
        400,
        None,
        br#"{"error": {"code": "sql_error", "message": "syntax", "pg_code": "42601"}}"#,
    );
    match sql {
        Err(EdgeError::Sidecar {
            status: 400, body, ..
        }) => {
            assert_eq!(body.error.pg_code.as_deref(), Some("42601"))
        }
        other => panic!("unexpected {other:?}"),
    }

    let busy: Result<QueryResponse, _> = interpret(
        503,
        Some("1".into()),
        br#"{"error": {"code": "overloaded", "message": "retry"}}"#,
    );
    assert_eq!(busy.expect_err("503").retry_after().as_deref(), Some("1"));

    let proxy: Result<QueryResponse, _> = interpret(502, None, b"Bad Gateway");
    assert_eq!(proxy, Err(EdgeError::BadResponse { status: 502 }));
}

#[test]
fn reads_go_again_only_when_no_sidecar_answered() {
    let answer = |status: u16, body: &[u8]| -> Exchange { Ok((status, None, body.to_vec())) };
    // Nobody reached, or a balancer speaking for a dead sidecar: once more.
    assert!(read_again(&Err(EdgeError::Unreachable)));
    assert!(read_again(&answer(502, b"<html>502 Bad Gateway</html>")));
    assert!(read_again(&answer(503, b"")));
    assert!(read_again(&answer(504, b"Gateway Time-out")));
    // A sidecar's own answer, even a failure, stands; so does a spent deadline.
    let ferry = br#"{"error": {"code": "overloaded", "message": "retry"}}"#;
    assert!(!read_again(&answer(503, ferry)));
    assert!(!read_again(&answer(200, b"{}")));
    assert!(!read_again(&answer(500, b"oops")));
    assert!(!read_again(&Err(EdgeError::Timeout { after_ms: 100 })));
}

//! Every answer carries `x-ferry-request-id`: the caller's (the edge's) when it sent a valid
//! one, a generated one otherwise.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn request_ids_are_echoed_or_generated() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let body = serde_json::to_vec(&json!({"sql": "SELECT 1 AS one"})).expect("json");
    let mut h = c.signed_now("POST", "/v1/query", &body);
    h.push(("x-ferry-request-id", "edge-req-42".into()));
    let r = c.raw("POST", "/v1/query", body.clone(), &h);
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ferry-request-id"], "edge-req-42");

    // Errors carry it too; a malformed id is replaced.
    let r = c.raw(
        "POST",
        "/v1/query",
        b"{".to_vec(),
        &[("x-ferry-request-id", "bad id!".into())],
    );
    assert_eq!(r.status, 401);
    let id = r.headers["x-ferry-request-id"].to_str().expect("ascii");
    assert_eq!(id.len(), 16, "{id}");
    assert_ne!(id, "bad id!");
    let r2 = c.get("/healthz");
    assert_ne!(
        r2.headers["x-ferry-request-id"],
        r.headers["x-ferry-request-id"]
    );
}

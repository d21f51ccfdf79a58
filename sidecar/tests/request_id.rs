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

/// The access line of each request is written at info, under its request id, and costs
/// nothing when that level is off (it is then not written at all).
#[test]
fn access_lines_carry_the_request_id() {
    let redis = common::RedisServer::start();
    let pg = common::PgServer::start();
    pg.setup_demo_schema();
    let lines = |level: &str| {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut sidecar = common::SidecarProcess::start(
            env!("CARGO_BIN_EXE_ferry-sidecar"),
            &redis.url(),
            &pg.url(),
            &[("FERRY_LOG", level)],
            std::process::Stdio::from(log.reopen().expect("reopen")),
        );
        let c = sidecar.client.clone();
        let body = serde_json::to_vec(&json!({"sql": "SELECT 1 AS one"})).expect("json");
        let mut h = c.signed_now("POST", "/v1/query?from=edge", &body);
        h.push(("x-ferry-request-id", "edge-req-77".into()));
        assert_eq!(c.raw("POST", "/v1/query?from=edge", body, &h).status, 200);
        sidecar.terminate();
        let logs = std::fs::read_to_string(log.path()).expect("read log");
        logs.lines()
            .filter(|l| l.contains("ferry::access"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let info = lines("info");
    let line = info
        .iter()
        .find(|l| l.contains("edge-req-77"))
        .unwrap_or_else(|| panic!("no access line under the request id: {info:?}"));
    assert!(
        line.contains("POST /v1/query?from=edge HTTP/1.1 200 "),
        "{line}"
    );
    assert!(line.trim_end().ends_with("ms"), "{line}");
    assert!(lines("warn").is_empty());
}

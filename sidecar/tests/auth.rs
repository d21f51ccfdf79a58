//! Every /v1 request must be signed, fresh and new: the accept/reject cases, replay and clock
//! skew, and that the check comes before the body is parsed.
use common::client::{nonce, now_s};
use ferry_testkit as common;
use serde_json::json;

const PATH: &str = "/v1/query";

/// (case name, headers to send, expected error code)
type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a str);

fn body() -> Vec<u8> {
    serde_json::to_vec(&json!({"sql": "SELECT 1 AS one"})).expect("json")
}

#[test]
fn signed_request_is_accepted() {
    let stack = common::Stack::start();
    let r = stack.client.raw(
        "POST",
        PATH,
        body(),
        &stack
            .client
            .headers_for("POST", PATH, &body(), now_s(), &nonce()),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["rows"][0]["one"], 1);
}

#[test]
fn bad_signatures_are_refused_with_401_and_a_code() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let good = || c.signed_now("POST", PATH, &body());
    let with = |name: &str, value: String| {
        good()
            .into_iter()
            .map(|(k, v)| {
                if k == name {
                    (k, value.clone())
                } else {
                    (k, v)
                }
            })
            .collect::<Vec<_>>()
    };
    let without = |name: &str| {
        good()
            .into_iter()
            .filter(|(k, _)| *k != name)
            .collect::<Vec<_>>()
    };
    let sig = good()[2].1.clone();
    let other_secret = common::Client::new(&c.base, "another-secret-0123456789");
    let cases: Vec<Case> = vec![
        ("no headers", vec![], "auth_missing"),
        ("no timestamp", without("x-ferry-timestamp"), "auth_missing"),
        ("no nonce", without("x-ferry-nonce"), "auth_missing"),
        ("no signature", without("x-ferry-signature"), "auth_missing"),
        (
            "timestamp not a number",
            with("x-ferry-timestamp", "soon".into()),
            "auth_malformed",
        ),
        (
            "short nonce",
            with("x-ferry-nonce", "abc123".into()),
            "auth_malformed",
        ),
        (
            "signature without v1=",
            with("x-ferry-signature", sig[3..].to_string()),
            "auth_malformed",
        ),
        (
            "truncated signature",
            with("x-ferry-signature", sig[..40].to_string()),
            "auth_malformed",
        ),
        (
            "wrong signature",
            with("x-ferry-signature", format!("v1={}", "0".repeat(64))),
            "auth_bad_signature",
        ),
        (
            "wrong secret",
            other_secret.signed_now("POST", PATH, &body()),
            "auth_bad_signature",
        ),
        (
            "signed for another path",
            c.signed_now("POST", "/v1/execute", &body()),
            "auth_bad_signature",
        ),
        (
            "signed for another body",
            c.headers_for("POST", PATH, b"{}", now_s(), &nonce()),
            "auth_bad_signature",
        ),
        (
            "signed for another method",
            c.signed_now("PUT", PATH, &body()),
            "auth_bad_signature",
        ),
        // Well past the 30 s window: these headers are made before the cases run, and a slow
        // machine must not bring one back inside it (31 s once passed as 30 after a second).
        (
            "expired (40 s old)",
            c.headers_for("POST", PATH, &body(), now_s() - 40, &nonce()),
            "auth_expired",
        ),
        (
            "from the future (40 s ahead)",
            c.headers_for("POST", PATH, &body(), now_s() + 40, &nonce()),
            "auth_expired",
        ),
    ];
    for (name, headers, code) in cases {
        let r = c.raw("POST", PATH, body(), &headers);
        assert_eq!(r.status, 401, "{name}: {:?}", r.body);
        assert_eq!(r.code(), code, "{name}: {:?}", r.body);
    }
    // Inside the window either way is fine.
    for skew in [-25i64, 25] {
        let ts = (now_s() as i64 + skew) as u64;
        let r = c.raw(
            "POST",
            PATH,
            body(),
            &c.headers_for("POST", PATH, &body(), ts, &nonce()),
        );
        assert_eq!(r.status, 200, "skew {skew}: {:?}", r.body);
    }
}

#[test]
fn a_replayed_request_is_refused() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let headers = c.signed_now("POST", PATH, &body());
    assert_eq!(c.raw("POST", PATH, body(), &headers).status, 200);
    let again = c.raw("POST", PATH, body(), &headers);
    assert_eq!(again.status, 401);
    assert_eq!(again.code(), "auth_replayed");
}

#[test]
fn auth_comes_before_body_parsing_and_database_work() {
    let stack = common::Stack::start();
    let c = &stack.client;
    // Garbage body, no signature: 401, not 400.
    let r = c.raw("POST", PATH, b"{not json".to_vec(), &[]);
    assert_eq!(r.status, 401);
    // A statement that would touch Postgres, badly signed: it never runs.
    let touch = serde_json::to_vec(&json!({"sql": "SELECT ferry_test_touch()"})).expect("json");
    let bad = common::Client::new(&c.base, "another-secret-0123456789");
    let r = c.raw(
        "POST",
        PATH,
        touch.clone(),
        &bad.signed_now("POST", PATH, &touch),
    );
    assert_eq!(r.status, 401);
    assert_eq!(stack.pg.reads(), 0);
}

#[test]
fn health_endpoints_need_no_signature() {
    let stack = common::Stack::start();
    let h = stack.client.get("/healthz");
    assert_eq!(h.status, 200);
    assert_eq!(h.body["status"], "ok");
    common::wait_until(
        "the first readiness probe",
        std::time::Duration::from_secs(5),
        || stack.client.get("/readyz").status == 200,
    );
    let r = stack.client.get("/readyz");
    assert_eq!(
        r.body,
        json!({"ready": true, "redis": "up", "postgres": "up",
               "pending_invalidations": 0, "cache_bypassed": false})
    );
}

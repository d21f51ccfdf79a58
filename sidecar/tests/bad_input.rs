//! Bad input gets a 4xx JSON error with a stable code, never a 5xx, and does not disturb
//! the requests around it.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn malformed_and_mistyped_bodies_are_400_naming_the_field() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let cases: Vec<(&str, Vec<u8>, &str, Option<&str>)> = vec![
        ("not json", b"{\"sql\": ".to_vec(), "bad_request", None),
        ("empty body", Vec::new(), "bad_request", None),
        ("array body", b"[1,2]".to_vec(), "bad_request", None),
        (
            "missing sql",
            br#"{"params": []}"#.to_vec(),
            "invalid_value",
            Some("sql"),
        ),
        (
            "sql not a string",
            br#"{"sql": 5}"#.to_vec(),
            "bad_request",
            Some("sql"),
        ),
        (
            "params not an array",
            br#"{"sql": "SELECT 1", "params": {}}"#.to_vec(),
            "bad_request",
            Some("params"),
        ),
        (
            "ttl a string",
            br#"{"sql": "SELECT 1", "cache": {"ttl_s": "60"}}"#.to_vec(),
            "bad_request",
            Some("cache.ttl_s"),
        ),
        (
            "ttl negative",
            br#"{"sql": "SELECT 1", "cache": {"ttl_s": -1}}"#.to_vec(),
            "bad_request",
            Some("cache.ttl_s"),
        ),
        (
            "ttl huge",
            br#"{"sql": "SELECT 1", "cache": {"ttl_s": 1e400}}"#.to_vec(),
            "bad_request",
            None,
        ),
        (
            "unknown field",
            br#"{"sql": "SELECT 1", "cahce": {"ttl_s": 5}}"#.to_vec(),
            "bad_request",
            None,
        ),
        (
            "bytes after the object",
            br#"{"sql": "SELECT 1"} junk"#.to_vec(),
            "bad_request",
            None,
        ),
        (
            "a second object",
            br#"{"sql": "SELECT 1"}{"sql": "SELECT 2"}"#.to_vec(),
            "bad_request",
            None,
        ),
        (
            "invalid utf-8",
            b"{\"sql\": \"SELECT \xff\"}".to_vec(),
            "bad_request",
            None,
        ),
        (
            "empty sql",
            br#"{"sql": "  "}"#.to_vec(),
            "invalid_value",
            Some("sql"),
        ),
        (
            "reserved key",
            br#"{"sql": "SELECT 1", "cache": {"ttl_s": 5, "key": "sha256:x"}}"#.to_vec(),
            "invalid_value",
            Some("cache.key"),
        ),
        (
            "empty key",
            br#"{"sql": "SELECT 1", "cache": {"ttl_s": 5, "key": ""}}"#.to_vec(),
            "invalid_value",
            Some("cache.key"),
        ),
    ];
    for (name, body, code, field) in cases {
        let r = c.block_on(c.post_bytes("/v1/query", body));
        assert_eq!(r.status, 400, "{name}: {:?}", r.body);
        assert_eq!(r.code(), code, "{name}: {:?}", r.body);
        if let Some(f) = field {
            assert_eq!(r.body["error"]["field"], f, "{name}: {:?}", r.body);
        }
    }
    // Deep nesting is refused by the JSON parser's recursion limit, not by a stack overflow.
    let deep = format!(
        "{{\"sql\": \"SELECT 1\", \"params\": [{}{}]}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let r = c.block_on(c.post_bytes("/v1/query", deep.into_bytes()));
    assert_eq!(r.status, 400, "{:?}", r.body);
    // The sidecar is unharmed.
    assert_eq!(
        c.query(json!({"sql": "SELECT 1 AS one"})).body["rows"][0]["one"],
        1
    );
}

#[test]
fn wrong_content_types_are_415() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let body = br#"{"sql": "SELECT 1 AS one"}"#.to_vec();
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonp",
    ] {
        let mut headers = c.signed_now("POST", "/v1/query", &body);
        headers.push(("content-type", ct.to_string()));
        // A request carrying only this content type (send_raw would add application/json).
        let r = c.block_on(async {
            let mut req = c
                .http
                .post(format!("{}/v1/query", c.base))
                .body(body.clone());
            for (k, v) in &headers {
                req = req.header(*k, v);
            }
            let resp = req.send().await.expect("send");
            let status = resp.status().as_u16();
            let v: serde_json::Value = resp.json().await.unwrap_or_default();
            (status, v)
        });
        assert_eq!(r.0, 415, "{ct}: {:?}", r.1);
        assert_eq!(r.1["error"]["code"], "unsupported_media_type");
    }
    let ok = c.raw("POST", "/v1/query", body.clone(), &{
        let mut h = c.signed_now("POST", "/v1/query", &body);
        h.push(("content-type", "application/json; charset=utf-8".into()));
        h
    });
    assert_eq!(ok.status, 200, "{:?}", ok.body);
}

#[test]
fn oversized_bodies_are_413() {
    let stack = common::Stack::start_with(|c| c.server.body_limit_bytes = 4096);
    let c = &stack.client;
    let big = json!({"sql": format!("SELECT '{}' AS x", "a".repeat(5000))});
    let r = c.query(big);
    assert_eq!(r.status, 413, "{:?}", r.body);
    assert_eq!(r.code(), "payload_too_large");
    let fits = json!({"sql": format!("SELECT '{}' AS x", "a".repeat(3000))});
    assert_eq!(c.query(fits).status, 200);
}

#[test]
fn unknown_paths_and_methods_are_json_errors() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let r = c.get("/v1/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.code(), "not_found");
    let r = c.get("/v1/query");
    assert_eq!(r.status, 405);
    assert_eq!(r.code(), "method_not_allowed");
}

#[test]
fn the_callers_sql_errors_are_400_with_the_postgres_code() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let cases = [
        ("SELECT 1 +", "42601"),
        ("SELECT nope FROM items", "42703"),
        ("SELECT * FROM no_such_table", "42P01"),
        ("SELECT 1/0", "22012"),
    ];
    for (sql, pg_code) in cases {
        let r = c.query(json!({"sql": sql}));
        assert_eq!(r.status, 400, "{sql}: {:?}", r.body);
        assert_eq!(r.code(), "sql_error");
        assert_eq!(r.body["error"]["pg_code"], pg_code, "{sql}");
    }
    let r = c.execute(json!({"sql": "INSERT INTO items (id) VALUES (1)"}));
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["pg_code"], "23502");
}

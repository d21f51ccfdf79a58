//! End to end: the edge Worker built to wasm, running in workerd (`wrangler dev`), calling the
//! real sidecar over real Redis and Postgres. Drives the edge over HTTP like a client would.
use ferry_testkit::{self as kit, client::Answer, Client, Stack, WranglerDev};
use serde_json::json;

fn edge_client(w: &WranglerDev) -> Client {
    // The edge needs no signature from its clients; the secret here is unused.
    Client::new(&w.url(), kit::SECRET)
}

fn get(c: &Client, path: &str) -> Answer {
    c.raw("GET", path, Vec::new(), &[])
}

fn bearer(key: &str) -> Vec<(&'static str, String)> {
    vec![("authorization", format!("Bearer {key}"))]
}

/// Writes and the cache routes need the edge's API key.
fn get_auth(c: &Client, path: &str) -> Answer {
    c.raw("GET", path, Vec::new(), &bearer(kit::API_KEY))
}

fn put_auth(c: &Client, path: &str, body: serde_json::Value) -> Answer {
    c.raw(
        "PUT",
        path,
        body.to_string().into_bytes(),
        &bearer(kit::API_KEY),
    )
}

#[test]
fn the_edge_reads_writes_and_caches_through_the_sidecar() {
    let mut stack = Stack::start();
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = edge_client(&edge);

    let h = get(&c, "/health");
    assert_eq!(h.status, 200, "{:?}\n{}", h.body, edge.log());
    assert_eq!(h.body["sidecar"], "up", "anyone learns up or down, no more");
    let detailed = get_auth(&c, "/health");
    assert_eq!(
        detailed.body["sidecar"]["ready"], true,
        "{:?}",
        detailed.body
    );

    // Every answer carries a request id; a caller's well-formed one is kept end to end.
    let id = h.headers["x-ferry-request-id"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert_eq!(id.len(), 16, "{id}");
    let r = c.raw(
        "GET",
        "/items/abc",
        Vec::new(),
        &[("x-ferry-request-id", "trace-me-1".into())],
    );
    assert_eq!(r.headers["x-ferry-request-id"], "trace-me-1");

    // Read one item: miss, then hit.
    let first = get(&c, "/items/7");
    assert_eq!(first.status, 200, "{:?}\n{}", first.body, edge.log());
    assert_eq!(first.body["cache"], "miss");
    assert_eq!(first.body["item"]["name"], "item 7");
    assert_eq!(first.body["item"]["price"], "8.75");
    let second = get(&c, "/items/7");
    assert_eq!(second.body["cache"], "hit");
    assert_eq!(second.body["item"], first.body["item"]);

    // Many in one call, in the order asked, with the missing ones named.
    let batch = get(&c, "/items?ids=3,1,9999");
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    assert_eq!(batch.body["items"][0]["id"], 3);
    assert_eq!(batch.body["items"][1]["id"], 1);
    assert_eq!(batch.body["missing"], json!([9999]));

    // Write, then the next read is fresh (a miss with the new value), then cached again.
    let w = put_auth(
        &c,
        "/items/7",
        json!({"name": "written at the edge", "price": "9.99"}),
    );
    assert_eq!(w.status, 200, "{:?}", w.body);
    assert_eq!(
        w.body,
        json!({"id": 7, "written": true, "invalidation": "done"})
    );
    let fresh = get(&c, "/items/7");
    assert_eq!(fresh.body["cache"], "miss");
    assert_eq!(fresh.body["item"]["name"], "written at the edge");
    assert_eq!(fresh.body["item"]["price"], "9.99");
    assert_eq!(get(&c, "/items/7").body["cache"], "hit");
    let batch = get(&c, "/items?ids=7");
    assert_eq!(batch.body["items"][0]["name"], "written at the edge");

    // Many items in one transaction: both written, both fresh; a bad one fails them all.
    assert_eq!(get(&c, "/items/8").body["cache"], "miss");
    let both = json!({"items": [{"id": 8, "name": "desk", "price": 80},
                                {"id": 9, "name": "chair", "price": "40.00"}]});
    let w = put_auth(&c, "/items", both);
    assert_eq!(w.status, 200, "{:?}\n{}", w.body, edge.log());
    assert_eq!(w.body, json!({"written": 2, "invalidation": "done"}));
    assert_eq!(get(&c, "/items/8").body["item"]["name"], "desk");
    assert_eq!(get(&c, "/items/9").body["item"]["price"], "40.00");
    // The second passes the edge's checks and fails in Postgres (text cannot hold a NUL).
    let half_bad = json!({"items": [{"id": 8, "name": "sofa", "price": 1},
                                    {"id": 9, "name": "lamp\u{0}", "price": "2.00"}]});
    let r = put_auth(&c, "/items", half_bad);
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.body["error"]["statement"], 1,
        "the failing statement is named"
    );
    let said = r.body.to_string();
    assert!(
        !said.contains("UTF8") && said.contains("22021"),
        "Ferry's code and the SQLSTATE, not Postgres's words: {said}"
    );
    let names: Vec<String> = stack
        .pg
        .client()
        .query("SELECT name FROM items WHERE id IN (8, 9) ORDER BY id", &[])
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        names,
        ["desk", "chair"],
        "nothing of the failed transaction"
    );
    let r = put_auth(&c, "/items", json!({"items": []}));
    assert_eq!((r.status, r.code()), (400, "invalid_value"), "{:?}", r.body);

    // Plain cache get/set.
    let s = put_auth(
        &c,
        "/cache/greeting",
        json!({"value": "hello", "ttl_s": 60}),
    );
    assert_eq!(s.body, json!({"key": "greeting", "stored": true}));
    assert_eq!(
        get_auth(&c, "/cache/greeting").body,
        json!({"key": "greeting", "value": "hello"})
    );
    let none = get_auth(&c, "/cache/absent");
    assert_eq!(none.status, 404);
    assert_eq!(none.code(), "not_found");

    // Bad input: 4xx JSON, never a bare 500.
    for (path, status, code) in [
        ("/items/abc", 400, "invalid_value"),
        ("/items/0", 400, "invalid_value"),
        ("/items?ids=1,x", 400, "invalid_value"),
        ("/items/999999", 404, "not_found"),
        ("/nowhere", 404, "not_found"),
    ] {
        let r = get(&c, path);
        assert_eq!(r.status, status, "{path}: {:?}", r.body);
        assert_eq!(r.code(), code, "{path}: {:?}", r.body);
    }
    let r = put_auth(&c, "/items/7", json!({"name": "no price"}));
    assert_eq!(r.status, 400, "{:?}", r.body);
    let r = put_auth(
        &c,
        "/items/7",
        json!({"name": "x", "price": "not a number"}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["error"]["field"], "price", "refused at the edge");
    // One Postgres refuses: its SQLSTATE passes through, its words do not.
    let r = put_auth(&c, "/items/7", json!({"name": "x\u{0}", "price": "1.00"}));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.body["error"]["pg_code"], "22021",
        "the sidecar's 400 passes through"
    );
    assert!(!r.body.to_string().contains("UTF8"), "{:?}", r.body);

    // Sidecar stopped: 502 JSON, and the edge stays up.
    stack.sidecar.stop();
    for _ in 0..3 {
        let r = get(&c, "/items/8");
        assert_eq!(r.status, 502, "{:?}", r.body);
        assert_eq!(r.code(), "sidecar_unreachable");
    }
    assert_eq!(get(&c, "/health").status, 502);
    assert_eq!(get(&c, "/items/abc").status, 400, "the edge still answers");
}

#[test]
fn a_wrong_secret_on_the_edge_is_reported_clearly() {
    let stack = Stack::start();
    let edge = WranglerDev::start(
        &stack.sidecar.base_url(),
        "not-the-sidecar-secret-0123",
        5_000,
    );
    let r = get(&edge_client(&edge), "/items/1");
    assert_eq!(r.status, 502, "{:?}\n{}", r.body, edge.log());
    assert_eq!(r.code(), "sidecar_auth_failed");
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("FERRY_SECRET"));
}

#[test]
fn a_sidecar_that_never_answers_is_a_504() {
    // Accepts connections, never answers: the edge's timeout must fire.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let edge = WranglerDev::start(&url, kit::SECRET, 500);
    let r = get(&edge_client(&edge), "/items/1");
    assert_eq!(r.status, 504, "{:?}\n{}", r.body, edge.log());
    assert_eq!(r.code(), "sidecar_timeout");
    drop(silent);
}

#[test]
fn a_redirecting_sidecar_url_is_reported_never_followed() {
    // Something at the sidecar's URL answers 301 (a proxy sending http to https, say).
    // Followed, fetch would resend a signed POST as a bodiless GET to wherever it points.
    use std::io::{Read, Write};
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let target = elsewhere.local_addr().expect("addr");
    elsewhere.set_nonblocking(true).expect("nonblocking");
    let redirector = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", redirector.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for mut conn in redirector.incoming().flatten() {
            let mut buf = [0u8; 8192];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 301 Moved Permanently\r\nlocation: http://{target}/v1/query\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    let edge = WranglerDev::start(&url, kit::SECRET, 2_000);
    let r = get(&edge_client(&edge), "/items/1");
    assert_eq!(r.status, 502, "{:?}\n{}", r.body, edge.log());
    assert_eq!(r.code(), "sidecar_bad_response");
    assert!(
        matches!(elsewhere.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the edge followed the redirect"
    );
}

#[test]
fn anonymous_callers_can_only_read() {
    // A readiness snapshot a second old: /health traffic must not reach the pools.
    let stack = Stack::start_with(|c| c.server.readiness_interval_ms = 1_000);
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = edge_client(&edge);
    assert_eq!(get(&c, "/items/7").status, 200, "anyone may read");

    let wrong = bearer("not-the-api-key-0123456789");
    let attempts: [(&str, &str, Vec<u8>); 5] = [
        (
            "PUT",
            "/items/7",
            br#"{"name": "anonymous", "price": "1.00"}"#.to_vec(),
        ),
        (
            "PUT",
            "/items",
            br#"{"items": [{"id": 7, "name": "anonymous", "price": "1.00"}]}"#.to_vec(),
        ),
        ("POST", "/items/7/reprice", br#"{"percent": 100}"#.to_vec()),
        ("PUT", "/cache/x", br#"{"value": "anonymous"}"#.to_vec()),
        ("GET", "/cache/x", Vec::new()),
    ];
    for (method, path, body) in &attempts {
        for headers in [Vec::new(), wrong.clone()] {
            let r = c.raw(method, path, body.clone(), &headers);
            assert_eq!(r.status, 401, "{method} {path}: {:?}", r.body);
            assert_eq!(r.code(), "unauthorized", "{:?}", r.body);
        }
    }
    let (name, price): (String, String) = stack
        .pg
        .client()
        .query_one("SELECT name, price::text FROM items WHERE id = 7", &[])
        .map(|r| (r.get(0), r.get(1)))
        .expect("row");
    assert_eq!(
        (name.as_str(), price.as_str()),
        ("item 7", "8.75"),
        "no anonymous write reached Postgres"
    );
    let (began, what): (i64, Option<String>) = stack
        .pg
        .client()
        .query_one(
            "SELECT count(*), string_agg(usename || ': ' || query, ' | ') FROM pg_stat_activity \
             WHERE state LIKE 'idle in transaction%' AND usename <> 'ferry_owner' \
               AND application_name NOT IN ('ferry-analysis', 'ferry-own-session-probe')",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .expect("activity");
    // (Ferry's own role keeps its books in short transactions of its own; its analysis and
    // its own-session probe name theirs apart.)
    assert_eq!(began, 0, "no anonymous transaction was begun: {what:?}");
    let mut redis = stack.redis.conn();
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("ferry:k:*")
        .query(&mut redis)
        .expect("keys");
    assert!(keys.is_empty(), "no anonymous cache write: {keys:?}");

    // With the key: the edge's own namespace, bounded in size and time.
    let ok = put_auth(&c, "/cache/x", json!({"value": "v", "ttl_s": 60}));
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("ferry:k:*")
        .query(&mut redis)
        .expect("keys");
    assert_eq!(keys, vec!["ferry:k:edge:x".to_string()]);
    for body in [
        json!({"value": "v".repeat(4097)}),
        json!({"value": "v", "ttl_s": 0}),
        json!({"value": "v", "ttl_s": 86_401}),
    ] {
        let r = put_auth(&c, "/cache/y", body);
        assert_eq!(r.status, 400, "{:?}", r.body);
    }
    let w = put_auth(
        &c,
        "/items/7",
        json!({"name": "with the key", "price": "1.00"}),
    );
    assert_eq!(w.status, 200, "{:?}", w.body);

    // /health under load: answered from the sidecar's readiness snapshot, not the pools.
    let state = &stack.sidecar.state;
    let (before, start) = (state.readiness_probes(), std::time::Instant::now());
    let healthy = c.block_on(async {
        let calls = (0..300).map(|_| c.send_raw("GET", "/health", Vec::new(), &[]));
        futures::future::join_all(calls).await
    });
    let took = start.elapsed();
    assert!(healthy.iter().all(|a| a.status == 200));
    let probes = state.readiness_probes() - before;
    println!("FIGURES /health x 300 in {took:?}: {probes} readiness probes");
    assert!(
        probes <= took.as_secs() + 2,
        "{probes} probes for 300 /health calls in {took:?}"
    );
}

//! Plain cache commands on caller-managed keys: get, set with TTL, del, mget, mset, incr,
//! expire, in their own key namespace.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn every_command_works_against_real_redis() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let ok = |body| {
        let r = c.cache(body);
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body
    };
    assert_eq!(
        ok(json!({"op": "get", "key": "a"})),
        json!({"op": "get", "value": null})
    );
    assert_eq!(
        ok(json!({"op": "set", "key": "a", "value": "1", "ttl_s": 100})),
        json!({"op": "set"})
    );
    assert_eq!(ok(json!({"op": "get", "key": "a"}))["value"], "1");
    let ttl: i64 = redis::cmd("TTL")
        .arg("ferry:k:a")
        .query(&mut stack.redis.conn())
        .expect("ttl");
    assert!(
        (1..=100).contains(&ttl),
        "stored under ferry:k: with its TTL, got {ttl}"
    );

    assert_eq!(ok(json!({"op": "incr", "key": "a"}))["value"], 2);
    assert_eq!(ok(json!({"op": "incr", "key": "a", "by": -5}))["value"], -3);
    assert_eq!(ok(json!({"op": "incr", "key": "fresh"}))["value"], 1);

    assert_eq!(
        ok(
            json!({"op": "mset", "entries": [{"key": "x", "value": "ex"}, {"key": "y", "value": "why ✓"}], "ttl_s": 50})
        ),
        json!({"op": "mset"})
    );
    assert_eq!(
        ok(json!({"op": "mget", "keys": ["x", "missing", "y"]}))["values"],
        json!(["ex", null, "why ✓"])
    );
    assert_eq!(
        ok(json!({"op": "expire", "key": "x", "ttl_s": 1}))["applied"],
        true
    );
    assert_eq!(
        ok(json!({"op": "expire", "key": "missing", "ttl_s": 1}))["applied"],
        false
    );
    assert_eq!(
        ok(json!({"op": "del", "keys": ["x", "y", "missing"]}))["deleted"],
        2
    );
    assert_eq!(ok(json!({"op": "get", "key": "y"}))["value"], json!(null));
    // Without a TTL the key does not expire.
    ok(json!({"op": "set", "key": "forever", "value": "v"}));
    let ttl: i64 = redis::cmd("TTL")
        .arg("ferry:k:forever")
        .query(&mut stack.redis.conn())
        .expect("ttl");
    assert_eq!(ttl, -1);
}

#[test]
fn command_mistakes_are_4xx() {
    let stack = common::Stack::start();
    let c = &stack.client;
    c.cache(json!({"op": "set", "key": "word", "value": "hello"}));
    let cases = [
        (json!({"op": "incr", "key": "word"}), 400, "invalid_value"),
        (json!({"op": "get"}), 400, "bad_request"),
        (json!({"op": "fly", "key": "a"}), 400, "bad_request"),
        (json!({"op": "get", "key": ""}), 400, "invalid_value"),
        (
            json!({"op": "get", "key": "k".repeat(600)}),
            400,
            "invalid_value",
        ),
        (
            json!({"op": "set", "key": "a", "value": "v", "ttl_s": 0}),
            400,
            "invalid_value",
        ),
        (json!({"op": "del", "keys": []}), 400, "invalid_value"),
        (json!({"op": "mset", "entries": []}), 400, "invalid_value"),
        (
            json!({"op": "set", "key": "a", "value": 5}),
            400,
            "bad_request",
        ),
    ];
    for (body, status, code) in cases {
        let r = c.cache(body.clone());
        assert_eq!(r.status, status, "{body}: {:?}", r.body);
        assert_eq!(r.code(), code, "{body}: {:?}", r.body);
    }
    // One bad item in a list is refused, named by its index, and nothing of the list runs:
    // the good key before it is not written either.
    let bad_items = [
        (json!({"op": "mget", "keys": ["ok", "a\u{1}b"]}), "keys[1]"),
        (json!({"op": "del", "keys": ["ok", "", "ok2"]}), "keys[1]"),
        (
            json!({"op": "mset", "entries": [
                {"key": "fresh", "value": "v"},
                {"key": "k".repeat(600), "value": "v"},
            ]}),
            "entries[1].key",
        ),
    ];
    for (body, field) in bad_items {
        let r = c.cache(body.clone());
        assert_eq!(r.status, 400, "{body}: {:?}", r.body);
        assert_eq!(r.code(), "invalid_value", "{body}: {:?}", r.body);
        assert_eq!(r.body["error"]["field"], field, "{body}: {:?}", r.body);
    }
    let fresh: Option<String> = redis::cmd("GET")
        .arg("ferry:k:fresh")
        .query(&mut stack.redis.conn())
        .expect("get");
    assert_eq!(fresh, None, "a refused mset wrote its first entry");
    // A value someone else stored as raw bytes is refused by name, not mangled.
    redis::cmd("SET")
        .arg("ferry:k:bin")
        .arg(&[0xffu8, 0xfe][..])
        .query::<()>(&mut stack.redis.conn())
        .expect("set raw");
    let r = c.cache(json!({"op": "get", "key": "bin"}));
    assert_eq!(r.status, 422);
    assert_eq!(r.code(), "not_text");
}

#[test]
fn commands_fail_clearly_when_redis_is_down() {
    let mut stack = common::Stack::start();
    stack.redis.kill();
    let r = stack.client.cache(json!({"op": "get", "key": "a"}));
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.code(), "cache_unavailable");
    assert!(r.headers.contains_key("retry-after"));
}

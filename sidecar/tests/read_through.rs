//! Read-through: a miss runs on Postgres and is written back; the next read is a hit served
//! from Redis without touching Postgres (counted on the Postgres side).
use ferry_testkit as common;
use serde_json::json;

const SQL: &str = "SELECT id, name, ferry_test_touch() AS touched FROM items WHERE id = $1";

#[test]
fn miss_then_hit_without_touching_postgres() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let req = json!({"sql": SQL, "params": [7], "cache": {"ttl_s": 60}});

    let first = c.query(req.clone());
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(first.body["cache"], "miss");
    assert_eq!(first.body["age_ms"], 0);
    assert_eq!(first.body["rows"][0]["name"], "item 7");
    assert_eq!(stack.pg.reads(), 1);
    let key = first.body["key"]
        .as_str()
        .expect("key returned")
        .to_string();
    assert!(key.starts_with("sha256:"), "{key}");

    std::thread::sleep(std::time::Duration::from_millis(20));
    for _ in 0..5 {
        let hit = c.query(req.clone());
        assert_eq!(hit.status, 200);
        assert_eq!(hit.body["cache"], "hit");
        assert_eq!(hit.body["rows"], first.body["rows"]);
        assert_eq!(hit.body["key"], key.as_str());
        assert!(
            hit.body["age_ms"].as_u64().expect("age") >= 20,
            "{:?}",
            hit.body
        );
    }
    assert_eq!(
        stack.pg.reads(),
        1,
        "hits must not run the statement on Postgres"
    );

    // The entry is in Redis under the configured prefix, with the TTL asked for.
    let ttl: i64 = redis::cmd("TTL")
        .arg(format!("ferry:q:{key}"))
        .query(&mut stack.redis.conn())
        .expect("TTL");
    assert!((1..=60).contains(&ttl), "ttl {ttl}");

    // Other parameters are another entry.
    let other = c.query(json!({"sql": SQL, "params": [8], "cache": {"ttl_s": 60}}));
    assert_eq!(other.body["cache"], "miss");
    assert_eq!(other.body["rows"][0]["name"], "item 8");
    assert_eq!(stack.pg.reads(), 2);
}

#[test]
fn no_cache_policy_goes_straight_to_postgres() {
    let stack = common::Stack::start();
    for n in 1..=3 {
        let r = stack.client.query(json!({"sql": SQL, "params": [1]}));
        assert_eq!(r.status, 200);
        assert_eq!(r.body["cache"], "bypass");
        assert!(r.body.get("key").is_none());
        assert_eq!(stack.pg.reads(), n);
    }
}

#[test]
fn named_entries_are_shared_by_name() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let named =
        |sql: &str| json!({"sql": sql, "params": [3], "cache": {"ttl_s": 60, "key": "item:3"}});
    let first = c.query(named(SQL));
    assert_eq!(first.body["cache"], "miss");
    assert_eq!(first.body["key"], "item:3");
    // Same name, same entry: a name is the caller's promise that the result is the same.
    let second = c.query(named(SQL));
    assert_eq!(second.body["cache"], "hit");
    assert_eq!(stack.pg.reads(), 1);
}

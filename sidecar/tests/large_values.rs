//! Results whose cache entry would exceed cache.max_entry_bytes are answered but not cached.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn oversized_results_are_answered_and_marked_bypass() {
    let stack = common::Stack::start_with(|c| c.cache.max_entry_bytes = 2000);
    let c = &stack.client;
    let big = json!({"sql": "SELECT repeat('x', 5000) AS blob", "cache": {"ttl_s": 60}});
    for _ in 0..2 {
        let r = c.query(big.clone());
        assert_eq!(r.status, 200);
        assert_eq!(r.body["cache"], "bypass", "{:?}", r.body["cache"]);
        assert_eq!(r.body["rows"][0]["blob"].as_str().map(str::len), Some(5000));
    }
    let key = c.query(big).body["key"].as_str().expect("key").to_string();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(format!("ferry:q:{key}"))
        .query(&mut stack.redis.conn())
        .expect("exists");
    assert_eq!(exists, 0);
    let small = json!({"sql": "SELECT repeat('x', 500) AS blob", "cache": {"ttl_s": 60}});
    assert_eq!(c.query(small.clone()).body["cache"], "miss");
    assert_eq!(c.query(small).body["cache"], "hit");
}

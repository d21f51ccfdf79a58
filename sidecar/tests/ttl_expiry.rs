//! A cached entry lives for its TTL, then the next read is a miss that runs on Postgres again.
use ferry_testkit as common;
use serde_json::json;
use std::time::Duration;

#[test]
fn entry_expires_after_its_ttl() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let req = json!({
        "sql": "SELECT name, ferry_test_touch() AS t FROM items WHERE id = $1",
        "params": [5],
        "cache": {"ttl_s": 1}
    });
    assert_eq!(c.query(req.clone()).body["cache"], "miss");
    assert_eq!(c.query(req.clone()).body["cache"], "hit");
    assert_eq!(stack.pg.reads(), 1);
    // Redis expires keys with millisecond precision; 1.5 s is past a 1 s TTL on any machine.
    std::thread::sleep(Duration::from_millis(1500));
    let after = c.query(req.clone());
    assert_eq!(after.body["cache"], "miss", "{:?}", after.body);
    assert_eq!(stack.pg.reads(), 2);
    assert_eq!(c.query(req).body["cache"], "hit");
}

#[test]
fn ttl_must_be_in_range() {
    let stack = common::Stack::start();
    for ttl in [json!(0), json!(31 * 24 * 3600)] {
        let r = stack
            .client
            .query(json!({"sql": "SELECT 1", "cache": {"ttl_s": ttl}}));
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(r.code(), "invalid_value");
        assert_eq!(r.body["error"]["field"], "cache.ttl_s");
    }
}

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

/// A reader's TTL bounds the age of what it is served: an entry filled for an hour is not a
/// hit for a reader that asks for at most a second, once it is older than that.
#[test]
fn a_readers_ttl_bounds_the_age_of_what_it_is_served() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let read = |ttl_s: u64| {
        c.query(json!({
            "sql": "SELECT name, ferry_test_touch() AS t FROM items WHERE id = $1",
            "params": [6],
            "cache": {"ttl_s": ttl_s}
        }))
    };
    assert_eq!(read(3600).body["cache"], "miss");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        read(3600).body["cache"],
        "hit",
        "the hour-long reader still hits"
    );
    let short = read(1);
    assert_eq!(short.body["cache"], "miss", "{:?}", short.body);
    assert_eq!(
        stack.pg.reads(),
        2,
        "the one-second reader went to Postgres"
    );
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

//! Per-request freshness: no-cache skips the lookup and refreshes the entry; only-if-cached
//! answers from the cache or not at all, never touching Postgres.
use ferry_testkit as common;
use serde_json::json;

fn req(mode: &str) -> serde_json::Value {
    json!({"sql": "SELECT ferry_test_touch() AS n", "cache": {"ttl_s": 300, "key": "n", "mode": mode}})
}

#[test]
fn only_if_cached_never_touches_postgres() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let r = c.query(req("only-if-cached"));
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(r.code(), "not_cached");
    assert_eq!(stack.pg.reads(), 0);
    assert_eq!(c.query(req("default")).body["cache"], "miss");
    let r = c.query(req("only-if-cached"));
    assert_eq!(r.body["cache"], "hit");
    assert_eq!(stack.pg.reads(), 1);
}

#[test]
fn no_cache_refreshes_the_entry() {
    let stack = common::Stack::start();
    let c = &stack.client;
    assert_eq!(c.query(req("default")).body["rows"][0]["n"], 1);
    assert_eq!(c.query(req("default")).body["cache"], "hit");
    let r = c.query(req("no-cache"));
    assert_eq!(r.body["cache"], "miss");
    assert_eq!(r.body["rows"][0]["n"], 2);
    let r = c.query(req("default"));
    assert_eq!(r.body["cache"], "hit");
    assert_eq!(r.body["rows"][0]["n"], 2, "the entry was refreshed");
}

#[test]
fn unknown_modes_are_refused() {
    let stack = common::Stack::start();
    let r = stack.client.query(req("sometimes"));
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["field"], "cache.mode");
}

//! Named statements from config, and `auth.allow_raw_sql = false`: callers can only run those.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn named_queries_run_with_their_configured_policy() {
    let stack = common::Stack::start();
    let c = &stack.client;
    // deploy/ferry.toml: [queries.item] with ttl_s = 60 and tags = ["items"].
    let r = c.query(json!({"query": "item", "params": [5], "cache": {"key": "items:5"}}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["cache"], "miss");
    assert_eq!(r.body["rows"][0]["name"], "item 5");
    assert_eq!(
        c.query(json!({"query": "item", "params": [5], "cache": {"key": "items:5"}}))
            .body["cache"],
        "hit"
    );
    let w = c.execute(json!({"query": "upsert_item", "params": [5, "renamed", "1.00"], "invalidate": {"tags": ["items"]}}));
    assert_eq!(w.body, json!({"rows_affected": 1, "invalidation": "done"}));
    let r = c.query(json!({"query": "item", "params": [5], "cache": {"key": "items:5"}}));
    assert_eq!(r.body["cache"], "miss");
    assert_eq!(r.body["rows"][0]["name"], "renamed");
}

#[test]
fn raw_sql_can_be_switched_off() {
    let stack = common::Stack::start_with(|c| c.auth.allow_raw_sql = false);
    let c = &stack.client;
    for r in [
        c.query(json!({"sql": "SELECT 1"})),
        c.execute(json!({"sql": "DELETE FROM items"})),
        c.block_on(c.post("/v1/batch", &json!({"reads": [{"sql": "SELECT 1"}]}))),
    ] {
        let code = if r.status == 200 {
            r.body["results"][0]["error"]["code"].clone()
        } else {
            json!(r.code())
        };
        assert_eq!(code, "raw_sql_forbidden", "{:?}", r.body);
    }
    assert_eq!(c.query(json!({"sql": "SELECT 1"})).status, 403);
    let r = c.query(json!({"query": "item", "params": [1]}));
    assert_eq!(r.status, 200, "named queries still run: {:?}", r.body);
    let count: i64 = stack
        .pg
        .client()
        .query_one("SELECT count(*) FROM items", &[])
        .expect("count")
        .get(0);
    assert_eq!(count, 1000, "the raw DELETE never ran");
}

//! Generic batch: many /v1/query-style reads in one call, answered in order, each with its own
//! status or error; one failing read does not fail the others.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn reads_are_answered_in_order_each_on_its_own() {
    let stack = common::Stack::start();
    let c = &stack.client;
    c.query(json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 60}}));
    let reads = json!({"reads": [
        {"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 60}},
        {"sql": "SELECT name FROM items WHERE id = 2", "cache": {"ttl_s": 60}},
        {"sql": "SELECT 1 +"},
        {"sql": "SELECT name FROM items WHERE id = $1", "params": [3]},
        {"query": "item", "params": [4]},
        {"sql": "SELECT 1", "cache": {"ttl_s": 0}},
        {"query": "no_such_query"}
    ]});
    let r = c.block_on(c.post("/v1/batch", &reads));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let res = r.body["results"].as_array().expect("results");
    assert_eq!(res.len(), 7);
    assert_eq!(res[0]["ok"]["cache"], "hit");
    assert_eq!(res[0]["ok"]["rows"][0]["name"], "item 1");
    assert_eq!(res[1]["ok"]["cache"], "miss");
    assert_eq!(res[1]["ok"]["rows"][0]["name"], "item 2");
    assert_eq!(res[2]["error"]["code"], "sql_error");
    assert_eq!(res[2]["error"]["pg_code"], "42601");
    assert_eq!(res[3]["ok"]["cache"], "bypass");
    assert_eq!(res[3]["ok"]["rows"][0]["name"], "item 3");
    assert_eq!(
        res[4]["ok"]["cache"], "miss",
        "named query with its configured policy"
    );
    assert_eq!(res[4]["ok"]["rows"][0]["name"], "item 4");
    assert_eq!(res[5]["error"]["field"], "reads[5].cache.ttl_s");
    assert_eq!(res[6]["error"]["field"], "reads[6].query");
}

#[test]
fn many_misses_run_concurrently_within_the_pool() {
    let stack = common::Stack::start_with(|c| c.postgres.pool_size = 4);
    let c = &stack.client;
    let reads: Vec<_> = (1..=40)
        .map(|i| json!({"sql": "SELECT name, pg_sleep(0.05)::text AS s FROM items WHERE id = $1", "params": [i], "cache": {"ttl_s": 60}}))
        .collect();
    let r = c.block_on(c.post("/v1/batch", &json!({"reads": reads})));
    assert_eq!(r.status, 200);
    let res = r.body["results"].as_array().expect("results");
    for (i, x) in res.iter().enumerate() {
        assert_eq!(
            x["ok"]["rows"][0]["name"],
            format!("item {}", i + 1),
            "{x:?}"
        );
    }
    assert!(stack.pg.sidecar_backends() <= 4);
}

#[test]
fn batch_size_is_limited() {
    let stack = common::Stack::start_with(|c| c.cache.max_batch = 5);
    let c = &stack.client;
    let reads: Vec<_> = (0..6).map(|_| json!({"sql": "SELECT 1"})).collect();
    let r = c.block_on(c.post("/v1/batch", &json!({"reads": reads})));
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["field"], "reads");
    let r = c.block_on(c.post("/v1/batch", &json!({"reads": []})));
    assert_eq!(r.status, 400);
}

//! Concurrent misses on one cache key run one Postgres query; the others share its result.
use ferry_testkit as common;
use serde_json::json;

#[test]
fn five_hundred_identical_misses_run_one_query() {
    let stack = common::Stack::start_with(|c| {
        // Waiters hold no in-flight slot, but each request's lookup briefly does.
        c.server.max_in_flight = 1024;
    });
    let c = &stack.client;
    // Slow enough that every request arrives while the first one's query runs.
    let req = json!({
        "sql": "SELECT ferry_test_touch() AS n, pg_sleep(1)::text AS slept",
        "cache": {"ttl_s": 60}
    });
    let answers = c.block_on(async {
        let all = (0..500).map(|_| c.query_async(req.clone()));
        futures::future::join_all(all).await
    });
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(ok, 500);
    assert_eq!(stack.pg.reads(), 1, "exactly one query ran on Postgres");
    // Every answer carries the one result.
    assert!(answers.iter().all(|a| a.body["rows"][0]["n"] == 1));
    let shared = stack.sidecar.state.flights_joined();
    println!("500 concurrent identical misses: 1 postgres query, {shared} requests shared it");
    assert!(shared >= 1);
    // Now cached.
    assert_eq!(c.query(req).body["cache"], "hit");
    assert_eq!(stack.pg.reads(), 1);
}

#[test]
fn different_keys_do_not_share() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let answers = c.block_on(async {
        let all = (0..10).map(|i| {
            c.query_async(json!({
                "sql": "SELECT ferry_test_touch() AS n, $1::int AS i",
                "params": [i],
                "cache": {"ttl_s": 60}
            }))
        });
        futures::future::join_all(all).await
    });
    assert!(answers
        .iter()
        .all(|a| a.status == 200 && a.body["cache"] == "miss"));
    assert_eq!(stack.pg.reads(), 10);
}

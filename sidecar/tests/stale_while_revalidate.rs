//! After the TTL and within swr_s, the old rows are served at once (`stale`) and refreshed in
//! the background, once, however many reads see them stale.
use ferry_testkit as common;
use serde_json::json;
use std::time::Duration;

#[test]
fn stale_rows_are_served_and_refreshed_once() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let req = json!({
        "sql": "SELECT ferry_test_touch() AS n, pg_sleep(0.3)::text AS s",
        "cache": {"ttl_s": 1, "swr_s": 60}
    });
    assert_eq!(c.query(req.clone()).body["cache"], "miss");
    assert_eq!(stack.pg.reads(), 1);
    std::thread::sleep(Duration::from_millis(1200));

    // Twenty concurrent reads of the expired entry: served at once with the old rows, stale
    // (or, for any that arrive after the refresh landed, a hit on the new rows).
    let answers = c.block_on(async {
        futures::future::join_all((0..20).map(|_| c.query_async(req.clone()))).await
    });
    let mut stale = 0;
    for a in &answers {
        assert_eq!(a.status, 200, "{:?}", a.body);
        if a.body["cache"] == "stale" {
            stale += 1;
            assert_eq!(a.body["stale_reason"], "revalidating");
            assert_eq!(a.body["rows"][0]["n"], 1, "the old rows");
            assert!(a.body["age_ms"].as_u64().unwrap_or(0) >= 1000);
        } else {
            assert_eq!(a.body["cache"], "hit", "{:?}", a.body);
            assert_eq!(a.body["rows"][0]["n"], 2);
        }
    }
    assert!(stale >= 1, "the expired entry was served stale");
    // One background refresh ran; the next read is a fresh hit with the new rows.
    common::wait_until("the refresh to land", Duration::from_secs(5), || {
        c.query(req.clone()).body["cache"] == "hit"
    });
    let fresh = c.query(req.clone());
    assert_eq!(fresh.body["rows"][0]["n"], 2);
    assert_eq!(
        stack.pg.reads(),
        2,
        "exactly one refresh for twenty stale reads"
    );
}

#[test]
fn without_swr_an_expired_entry_is_a_miss() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let req = json!({"sql": "SELECT ferry_test_touch() AS n", "cache": {"ttl_s": 1}});
    c.query(req.clone());
    std::thread::sleep(Duration::from_millis(1200));
    let r = c.query(req);
    assert_eq!(r.body["cache"], "miss");
    assert_eq!(r.body["rows"][0]["n"], 2);
}

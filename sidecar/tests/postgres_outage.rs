//! Postgres down: cached reads keep being served, uncached reads and writes fail fast with a
//! clear JSON error (no hang), and everything recovers by itself when Postgres returns.
use ferry_testkit as common;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn postgres_stopped_then_started() {
    let mut stack = common::Stack::start();
    let c = &stack.client;
    let cached = json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [3], "cache": {"ttl_s": 300}});
    assert_eq!(c.query(cached.clone()).body["cache"], "miss");

    stack.pg.stop();

    let r = c.query(cached.clone());
    assert_eq!(r.status, 200, "cached reads survive: {:?}", r.body);
    assert_eq!(r.body["cache"], "hit");
    assert_eq!(r.body["rows"][0]["name"], "item 3");

    for body in [
        json!({"sql": "SELECT name FROM items WHERE id = 4"}),
        json!({"sql": "SELECT 5 AS n", "cache": {"ttl_s": 10}}),
    ] {
        let start = Instant::now();
        let r = c.query(body);
        let took = start.elapsed();
        assert_eq!(r.status, 503, "{:?}", r.body);
        assert_eq!(r.code(), "database_unavailable");
        assert!(r.headers.contains_key("retry-after"));
        // Bounded by the checkout timeout (1.5 s) plus a reconnect, far under the 10 s deadline.
        assert!(took < Duration::from_secs(5), "took {took:?}");
        let text = r.body.to_string();
        assert!(
            !text.contains("127.0.0.1") && !text.contains("5432"),
            "{text}"
        );
    }
    let w = c.execute(json!({"sql": "UPDATE items SET name = 'x' WHERE id = 4"}));
    assert_eq!(w.status, 503);
    assert_eq!(w.code(), "database_unavailable");
    common::wait_until(
        "readyz to see postgres down",
        Duration::from_secs(5),
        || c.get("/readyz").body["postgres"] == "down",
    );

    stack.pg.start_again();
    common::wait_until("reads to recover", Duration::from_secs(10), || {
        c.query(json!({"sql": "SELECT name FROM items WHERE id = 4"}))
            .status
            == 200
    });
    let w = c.execute(json!({"sql": "UPDATE items SET name = 'after' WHERE id = 4"}));
    assert_eq!(w.status, 200, "{:?}", w.body);
    let r = c.query(json!({"sql": "SELECT name FROM items WHERE id = 4"}));
    assert_eq!(r.body["rows"][0]["name"], "after");
}

/// A Postgres restart kills every pooled session, and the pool learns it one session at a
/// time. A write or a `begin` that draws a dead one has sent nothing yet: it takes another,
/// as many times as the pool has sessions, and none of them fails for it.
#[test]
fn writes_and_begins_after_a_restart_skip_every_dead_session() {
    let mut stack = common::Stack::start_with(|c| {
        // The r2d2 pool's share: a quarter (4 sessions); the rest are the workers'.
        c.postgres.pool_size = 16;
        c.postgres.min_idle = 0;
    });
    let c = stack.client.clone();
    // Fill the pool: four slow writes at once hold the pool's four sessions, and leave them
    // idle behind them. (Interactive transactions may hold at most half of them.)
    let writes = c.block_on(futures::future::join_all((0..4).map(|i| {
        let c = c.clone();
        async move {
            c.post(
                "/v1/execute",
                &json!({ "sql": "UPDATE items SET name = items.name FROM pg_sleep(0.5) \
                                 WHERE items.id = $1", "params": [10 + i] }),
            )
            .await
        }
    })));
    for w in writes {
        assert_eq!(w.status, 200, "{:?}", w.body);
    }
    stack.pg.stop();
    stack.pg.start_again();
    let b = c.block_on(c.post("/v1/transaction/begin", &json!({})));
    assert_eq!(b.status, 200, "begin after the restart: {:?}", b.body);
    let id = b.body["id"].clone();
    let r = c.block_on(c.post("/v1/transaction/rollback", &json!({"id": id})));
    assert_eq!(r.status, 200, "{:?}", r.body);
    for n in 0..4 {
        let w = c.execute(
            json!({"sql": "UPDATE items SET name = $1 WHERE id = 4", "params": [format!("n{n}")]}),
        );
        assert_eq!(w.status, 200, "write {n} after the restart: {:?}", w.body);
    }
}

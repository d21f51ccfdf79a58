//! Tag invalidation: a write invalidates every entry read with the tag, and a read after an
//! acknowledged write never returns the pre-write value, even under concurrent reads and writes.
use ferry_testkit as common;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[test]
fn invalidating_a_tag_drops_every_entry_carrying_it() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let read = |id: i64, tags: serde_json::Value| {
        c.query(
            json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [id],
                       "cache": {"ttl_s": 300, "tags": tags}}),
        )
    };
    for id in 1..=3 {
        assert_eq!(read(id, json!(["items"])).body["cache"], "miss");
    }
    assert_eq!(read(9, json!(["other"])).body["cache"], "miss");
    for id in 1..=3 {
        assert_eq!(read(id, json!(["items"])).body["cache"], "hit");
    }
    let w = c.execute(
        json!({"sql": "UPDATE items SET name = name || '!' WHERE id <= 3",
                             "invalidate": {"tags": ["items"]}}),
    );
    assert_eq!(w.body, json!({"rows_affected": 3, "invalidation": "done"}));
    for id in 1..=3 {
        let r = read(id, json!(["items"]));
        assert_eq!(r.body["cache"], "miss", "{:?}", r.body);
        assert_eq!(r.body["rows"][0]["name"], format!("item {id}!"));
    }
    assert_eq!(
        read(9, json!(["other"])).body["cache"],
        "hit",
        "other tags untouched"
    );
}

#[test]
fn no_stale_read_after_an_acknowledged_write_under_concurrency() {
    let stack = common::Stack::start_with(|c| c.server.max_in_flight = 1024);
    stack
        .pg
        .client()
        .batch_execute("CREATE TABLE counters (id int PRIMARY KEY, n bigint NOT NULL); INSERT INTO counters VALUES (1, 0);")
        .expect("counter table");
    let c = &stack.client;
    let acked = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    const WRITES: u64 = 100;
    const READERS: usize = 8;

    let (reads, stale, hits) = c.block_on(async {
        let writer = {
            let (acked, done) = (acked.clone(), done.clone());
            async move {
                for i in 1..=WRITES {
                    let w = c
                        .post(
                            "/v1/execute",
                            &json!({
                                "sql": "UPDATE counters SET n = $1 WHERE id = 1",
                                "params": [i],
                                "invalidate": {"tags": ["counters"]}
                            }),
                        )
                        .await;
                    assert_eq!(w.status, 200, "{:?}", w.body);
                    assert_eq!(w.body["invalidation"], "done");
                    acked.store(i, Ordering::SeqCst);
                    // Paced, so reads get to hit between writes as well as race them.
                    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
                }
                done.store(true, Ordering::SeqCst);
            }
        };
        let readers = (0..READERS).map(|_| {
            let (acked, done) = (acked.clone(), done.clone());
            async move {
                let (mut reads, mut stale, mut hits) = (0u64, 0u64, 0u64);
                while !done.load(Ordering::SeqCst) {
                    let before = acked.load(Ordering::SeqCst);
                    let r = c
                        .query_async(json!({
                            // Slow enough that reads are in flight while writes land.
                            "sql": "SELECT n, pg_sleep(0.02)::text AS s FROM counters WHERE id = 1",
                            "cache": {"ttl_s": 300, "tags": ["counters"]}
                        }))
                        .await;
                    assert_eq!(r.status, 200, "{:?}", r.body);
                    let n = r.body["rows"][0]["n"].as_u64().expect("n");
                    reads += 1;
                    if n < before {
                        stale += 1;
                    }
                    if r.body["cache"] == "hit" {
                        hits += 1;
                    }
                }
                (reads, stale, hits)
            }
        });
        let (_, per_reader) = futures::join!(writer, futures::future::join_all(readers));
        per_reader
            .into_iter()
            .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
    });
    println!("{WRITES} writes, {reads} concurrent reads ({hits} hits): {stale} stale reads");
    assert_eq!(
        stale, 0,
        "a read after an acknowledged write returned the old value"
    );
    assert!(hits > 0, "the cache was in use");
    assert!(reads > WRITES, "readers ran alongside the writer");
}

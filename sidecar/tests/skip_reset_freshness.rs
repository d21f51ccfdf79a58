//! Freshness on the path that skips the session reset: the demo's `[queries.item]`, which
//! Postgres finds plain, so its misses and refreshes run on sessions that are not reset after
//! them. Against two sidecar binaries sharing one Redis, a writer that bypasses Ferry (psql,
//! row 1) and a writer through the second sidecar (row 2): a read started after a Ferry write
//! was acknowledged never returns the row before it, and a read started `changes.max_lag_ms`
//! after a psql commit never returns the row before that. Postgres's rows judge, and its
//! `pg_stat_activity` shows the reads really ran without a reset behind them.
mod change_stream_common;
use change_stream_common as cs;
use ferry_testkit::SidecarProcess;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The opted-in statement, as the demo config names it.
const ITEM_SQL: &str = "SELECT id, name, price, tags, updated_at FROM items WHERE id = $1";

/// A read of row `id` through the named query (`no-cache`: from Postgres, refreshing the
/// entry). Row 1's entry is named by its statement and dropped by the query's `tables` (psql's
/// writes); row 2's is named as the keyspace names the row, so the Ferry writer drops it by
/// key.
fn item(s: &SidecarProcess, id: i64, mode: &str) -> (i64, String) {
    let cache = match id {
        1 => json!({"mode": mode}),
        _ => json!({"key": format!("items:{id}"), "mode": mode}),
    };
    let a = s
        .client
        .query(json!({"query": "item", "params": [id], "cache": cache}));
    assert_eq!(a.status, 200, "{:?}", a.body);
    let name = a.body["rows"][0]["name"].as_str().unwrap_or("v-1");
    let version = name.trim_start_matches('v').parse().unwrap_or(-1);
    (version, a.body["cache"].as_str().unwrap_or("").to_string())
}

#[test]
fn reads_that_skip_the_reset_never_return_a_row_from_before_a_write() {
    let redis = ferry_testkit::RedisServer::start();
    let pg = cs::logical_pg();
    pg.client()
        .batch_execute("UPDATE items SET name = 'v0' WHERE id IN (1, 2)")
        .expect("versions");
    // Every read on event-loop sessions and the pooled path alike: 4 connections, 2 workers.
    let env = [
        ("FERRY_POSTGRES_POOL_SIZE", "4"),
        ("FERRY_SERVER_WORKERS", "2"),
    ];
    let sidecars = [
        cs::spawn_with(&redis, &pg, &env),
        cs::spawn_with(&redis, &pg, &env),
    ];
    for s in &sidecars {
        cs::wait_caught_up(s);
    }
    // Row 1: psql's commits (bounded by the stream's lag); row 2: Ferry's acknowledged writes.
    let (outside, through_ferry) = (Mutex::new(Vec::new()), Mutex::new(Vec::new()));
    let reads: [Mutex<Vec<(Instant, i64)>>; 2] = Default::default();
    let kinds = Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut psql = pg.client();
            for n in 1..=150i64 {
                psql.execute(
                    "UPDATE items SET name = $1 WHERE id = 1",
                    &[&format!("v{n}")],
                )
                .expect("psql update");
                outside.lock().unwrap().push((Instant::now(), n));
                std::thread::sleep(Duration::from_millis(10));
            }
            done.store(true, Ordering::SeqCst);
        });
        scope.spawn(|| {
            let writer = &sidecars[1];
            for n in 1..=150i64 {
                let w = writer.client.execute(json!({
                    "query": "upsert_item", "params": [2, format!("v{n}"), "1.00"],
                    "invalidate": {"keys": ["items:2"]},
                }));
                assert_eq!(w.status, 200, "{:?}", w.body);
                assert_eq!(w.body["invalidation"], "done", "{:?}", w.body);
                through_ferry.lock().unwrap().push((Instant::now(), n));
                std::thread::sleep(Duration::from_millis(10));
                if done.load(Ordering::SeqCst) {
                    break;
                }
            }
        });
        for r in 0..4usize {
            let (sidecars, reads, kinds, done) = (&sidecars, &reads, &kinds, &done);
            scope.spawn(move || {
                let mut i = r;
                while !done.load(Ordering::SeqCst) {
                    i += 1;
                    let sidecar = &sidecars[i / 2 % 2];
                    if i % 5 == 0 {
                        // Straight to Postgres on a session that skips the reset (a row no
                        // one writes: a no-cache read refreshes the entry it reads).
                        item(sidecar, 3 + i as i64 % 8, "no-cache");
                        continue;
                    }
                    let row = i % 2;
                    let started = Instant::now();
                    let (seen, cache) = item(sidecar, row as i64 + 1, "default");
                    reads[row].lock().unwrap().push((started, seen));
                    let kind = format!("row {} {cache}", row + 1);
                    *kinds.lock().unwrap().entry(kind).or_default() += 1;
                }
            });
        }
    });
    let outside = outside.into_inner().unwrap();
    let through_ferry = through_ferry.into_inner().unwrap();
    let [reads1, reads2] = reads.map(|r| r.into_inner().unwrap());
    let kinds = kinds.into_inner().unwrap();
    let stale_outside = cs::stale_reads(&outside, &reads1, cs::MAX_LAG);
    let stale_ferry = cs::stale_reads(&through_ferry, &reads2, Duration::ZERO);
    println!(
        "FIGURES skip_reset freshness: {} reads of psql's row, {} stale past {} ms; {} reads of \
         Ferry's row, {} stale after an acknowledged write; answers {kinds:?}",
        reads1.len(),
        stale_outside,
        cs::MAX_LAG.as_millis(),
        reads2.len(),
        stale_ferry
    );
    assert_eq!(
        stale_ferry, 0,
        "a read after an acknowledged write saw the row before it"
    );
    assert_eq!(
        stale_outside, 0,
        "a read past the bound saw the row before psql's commit"
    );
    // The test proves something only if entries were served and refilled along the way.
    for kind in ["row 1 hit", "row 1 miss", "row 2 hit", "row 2 miss"] {
        assert!(
            kinds.get(kind).is_some_and(|n| *n >= 3),
            "too few of {kind}: {kinds:?}"
        );
    }

    // Postgres's rows judge the end state: each sidecar, read past the bound, agrees with them.
    cs::after_bound(Instant::now());
    let mut psql = pg.client();
    for id in [1i64, 2] {
        let name: String = psql
            .query_one("SELECT name FROM items WHERE id = $1", &[&(id as i32)])
            .expect("row")
            .get(0);
        for s in &sidecars {
            let (seen, _) = item(s, id, "default");
            assert_eq!(format!("v{seen}"), name, "row {id}");
        }
    }
    // The reads run with no reset behind them once Postgres has found the query plain (asked
    // in the background from startup): then some session's last statement is the item read
    // (no DISCARD ALL after it), as Postgres reports it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut last: Vec<Value>;
    loop {
        for s in &sidecars {
            item(s, 1, "no-cache");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        last = psql
            .query(
                "SELECT query FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'
                   AND state = 'idle'",
                &[],
            )
            .expect("pg_stat_activity")
            .iter()
            .map(|r| Value::String(r.get(0)))
            .collect();
        if last.iter().any(|q| q == ITEM_SQL) || std::time::Instant::now() > deadline {
            break;
        }
    }
    assert!(
        last.iter().any(|q| q == ITEM_SQL),
        "no session ended on the plain read: {last:?}"
    );
}

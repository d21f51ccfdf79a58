//! Postgres stopped during a mixed load: cached reads keep succeeding, uncached reads and writes
//! fail fast with a JSON 503/502, everything recovers by itself, no acknowledged write is lost
//! and no write is acknowledged that did not commit.
use ferry_testkit as common;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Tally {
    cached_ok: u64,
    cached_failed: u64,
    uncached_ok: u64,
    uncached_failed: u64,
    slowest_failure: Duration,
    acked: Vec<i64>,
    write_failed: u64,
    bad_bodies: u64,
}

#[test]
fn postgres_stop_under_load() {
    let mut stack = common::Stack::start();
    stack
        .pg
        .client()
        .batch_execute("CREATE TABLE ledger (id bigint PRIMARY KEY)")
        .expect("ledger");
    let c = stack.client.clone();
    // Warm the cached keys.
    for id in 1..=10 {
        c.query(json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [id], "cache": {"ttl_s": 300}}));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tally: Arc<Mutex<Tally>> = Arc::default();
    let load = {
        let (stop, tally) = (stop.clone(), tally.clone());
        std::thread::spawn(move || {
            c.block_on(async {
                let workers = (0..6).map(|w| {
                    let (c, stop, tally) = (c.clone(), stop.clone(), tally.clone());
                    async move {
                        let mut i = 0i64;
                        while !stop.load(Ordering::SeqCst) {
                            i += 1;
                            let started = Instant::now();
                            match w % 3 {
                                0 => {
                                    let r = c.query_async(json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [i % 10 + 1], "cache": {"ttl_s": 300}})).await;
                                    let mut t = tally.lock().expect("lock");
                                    if r.status == 200 { t.cached_ok += 1 } else { t.cached_failed += 1 }
                                }
                                1 => {
                                    let r = c.query_async(json!({"sql": "SELECT count(*) AS n FROM items"})).await;
                                    let mut t = tally.lock().expect("lock");
                                    if r.status == 200 {
                                        t.uncached_ok += 1
                                    } else {
                                        t.uncached_failed += 1;
                                        t.slowest_failure = t.slowest_failure.max(started.elapsed());
                                        if !matches!(r.status, 502..=504) || r.code().is_empty() { t.bad_bodies += 1 }
                                    }
                                }
                                _ => {
                                    let id = w as i64 * 1_000_000 + i;
                                    let r = c
                                        .post("/v1/execute", &json!({"sql": "INSERT INTO ledger (id) VALUES ($1)", "params": [id]}))
                                        .await;
                                    let mut t = tally.lock().expect("lock");
                                    if r.status == 200 {
                                        t.acked.push(id)
                                    } else {
                                        t.write_failed += 1;
                                        t.slowest_failure = t.slowest_failure.max(started.elapsed());
                                        if !matches!(r.status, 502..=504) || r.code().is_empty() { t.bad_bodies += 1 }
                                    }
                                }
                            }
                        }
                    }
                });
                futures::future::join_all(workers).await;
            })
        })
    };
    std::thread::sleep(Duration::from_millis(700));
    stack.pg.stop();
    std::thread::sleep(Duration::from_millis(2000));
    let uncached_failed_during = tally.lock().expect("lock").uncached_failed;
    stack.pg.start_again();
    let back = Instant::now();
    common::wait_until("uncached reads to recover", Duration::from_secs(10), || {
        stack.client.query(json!({"sql": "SELECT 1 AS one"})).status == 200
    });
    let recovered_after = back.elapsed();
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::SeqCst);
    load.join().expect("load");

    let t = tally.lock().expect("lock");
    let committed: Vec<i64> = stack
        .pg
        .client()
        .query("SELECT id FROM ledger", &[])
        .expect("ledger rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost: Vec<&i64> = t
        .acked
        .iter()
        .filter(|id| !committed.contains(id))
        .collect();
    println!(
        "FIGURES postgres stop under load: cached reads {} ok / {} failed; uncached reads {} ok / {} failed; \
         writes {} acknowledged / {} failed, {} committed, {} acknowledged-but-lost; slowest failure {:?}; \
         recovered {:?} after restart",
        t.cached_ok, t.cached_failed, t.uncached_ok, t.uncached_failed, t.acked.len(), t.write_failed,
        committed.len(), lost.len(), t.slowest_failure, recovered_after
    );
    assert_eq!(t.cached_failed, 0, "cached reads must survive");
    // Writes are counted over the whole run: one in flight when Postgres stops may spend up to
    // 2 s learning whether it committed (`write_outcome::outcome_patiently`), so with two
    // writers both can still be waiting when the 2 s outage ends (seen once in CI: 1 write
    // failed, after the window). Only the outage fails a write here.
    assert!(
        uncached_failed_during > 0 && t.write_failed > 0,
        "the outage was felt by uncached reads and writes"
    );
    assert_eq!(t.bad_bodies, 0, "failures are 502-504 with a JSON code");
    assert!(
        t.slowest_failure < Duration::from_secs(5),
        "failures are fast: {:?}",
        t.slowest_failure
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(committed.len() >= t.acked.len());
    assert!(t.uncached_ok > 0 && !t.acked.is_empty());
}

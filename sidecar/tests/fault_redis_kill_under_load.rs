//! Redis SIGKILLed during a steady read load, then restarted, four times: no read fails
//! (Postgres serves them), hits resume after each restart, and the pool reconnects without a
//! sidecar restart. Prints the figures RELIABILITY.md quotes (the time from Redis accepting
//! connections to the first hit, each time).
use ferry_testkit as common;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn reads_never_fail_while_redis_dies_and_returns() {
    // The production defaults for Redis timeouts and the breaker (the harness shortens them).
    let mut stack = common::Stack::start_with(|c| {
        let d = ferry_sidecar::config::RedisConfig::default();
        c.redis.checkout_timeout_ms = d.checkout_timeout_ms;
        c.redis.connect_timeout_ms = d.connect_timeout_ms;
        c.redis.io_timeout_ms = d.io_timeout_ms;
        c.redis.retry_after_failure_ms = d.retry_after_failure_ms;
    });
    let c = stack.client.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed, hits) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let hit_times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    // The first failed read's answer, for the assertion's message.
    let first_failure: Arc<Mutex<Option<String>>> = Arc::default();
    let load = {
        let (stop, sent, failed, hits, hit_times, first_failure) = (
            stop.clone(),
            sent.clone(),
            failed.clone(),
            hits.clone(),
            hit_times.clone(),
            first_failure.clone(),
        );
        std::thread::spawn(move || {
            c.block_on(async {
                let workers = (0..8).map(|w| {
                    let (c, stop, sent, failed, hits, hit_times, first_failure) = (
                        c.clone(),
                        stop.clone(),
                        sent.clone(),
                        failed.clone(),
                        hits.clone(),
                        hit_times.clone(),
                        first_failure.clone(),
                    );
                    async move {
                        let mut i = 0u64;
                        while !stop.load(Ordering::SeqCst) {
                            i += 1;
                            let id = (w * 7 + i) % 20 + 1;
                            let r = c
                                .query_async(json!({
                                    "sql": "SELECT name FROM items WHERE id = $1",
                                    "params": [id],
                                    "cache": {"ttl_s": 300}
                                }))
                                .await;
                            sent.fetch_add(1, Ordering::SeqCst);
                            if r.status != 200 || r.body["rows"][0]["name"] != format!("item {id}")
                            {
                                failed.fetch_add(1, Ordering::SeqCst);
                                first_failure
                                    .lock()
                                    .expect("lock")
                                    .get_or_insert_with(|| format!("{} {}", r.status, r.body));
                            } else if r.body["cache"] == "hit" {
                                hits.fetch_add(1, Ordering::SeqCst);
                                hit_times.lock().expect("lock").push(Instant::now());
                            }
                        }
                    }
                });
                futures::future::join_all(workers).await;
            })
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    let hits_before = hits.load(Ordering::SeqCst);
    let hits_at = |since: Instant| -> Option<Duration> {
        let first = hit_times
            .lock()
            .expect("lock")
            .iter()
            .copied()
            .filter(|t| *t > since)
            .min();
        first.map(|t| t - since)
    };
    // Several deaths and returns: a restarted Redis has dropped every pooled connection, and
    // each time the pool must be found dead as a whole, not one connection per request.
    let mut recoveries = Vec::new();
    let mut down_for = Duration::ZERO;
    let mut sent_while_down = 0;
    for _ in 0..4 {
        stack.redis.kill();
        let killed_at = Instant::now();
        let before = sent.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1000));
        sent_while_down += sent.load(Ordering::SeqCst) - before;
        stack.redis.restart();
        let restarted = Instant::now();
        down_for = restarted - killed_at;
        common::wait_until("hits to resume", Duration::from_secs(5), || {
            hits_at(restarted).is_some()
        });
        recoveries.push(hits_at(restarted).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::SeqCst);
    load.join().expect("load");
    let (sent, failed, hits) = (
        sent.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst),
        hits.load(Ordering::SeqCst),
    );
    let ms: Vec<u128> = recoveries.iter().map(|d| d.as_millis()).collect();
    println!(
        "FIGURES redis SIGKILL under load, 4 times: {sent} reads sent, {failed} failed, {hits} \
         hits ({hits_before} before the first kill), down {down_for:?} each time, first hit \
         after Redis accepted connections again: {ms:?} ms"
    );
    assert!(sent_while_down > 0);
    assert_eq!(
        failed,
        0,
        "a read failed because Redis failed: {:?}",
        first_failure.lock().expect("lock")
    );
    assert!(
        recoveries.iter().all(|d| *d < Duration::from_secs(2)),
        "{ms:?}"
    );
}

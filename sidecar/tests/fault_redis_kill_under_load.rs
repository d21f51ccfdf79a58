//! Redis SIGKILLed during a steady read load, then restarted: no read fails (Postgres serves
//! them), hits resume within 2 s of the restart, and the pool reconnects without a sidecar
//! restart. Prints the figures RELIABILITY.md quotes.
use ferry_testkit as common;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn reads_never_fail_while_redis_dies_and_returns() {
    let mut stack = common::Stack::start();
    let c = stack.client.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed, hits) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let last_hit: Arc<Mutex<Option<Instant>>> = Arc::default();
    let load = {
        let (stop, sent, failed, hits, last_hit) = (
            stop.clone(),
            sent.clone(),
            failed.clone(),
            hits.clone(),
            last_hit.clone(),
        );
        std::thread::spawn(move || {
            c.block_on(async {
                let workers = (0..8).map(|w| {
                    let (c, stop, sent, failed, hits, last_hit) = (
                        c.clone(),
                        stop.clone(),
                        sent.clone(),
                        failed.clone(),
                        hits.clone(),
                        last_hit.clone(),
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
                            } else if r.body["cache"] == "hit" {
                                hits.fetch_add(1, Ordering::SeqCst);
                                *last_hit.lock().expect("lock") = Some(Instant::now());
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
    stack.redis.kill();
    let killed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let sent_while_down = sent.load(Ordering::SeqCst);
    stack.redis.restart();
    let restarted = Instant::now();
    // Wait for a hit that happened after the restart.
    common::wait_until("hits to resume", Duration::from_secs(5), || {
        last_hit
            .lock()
            .expect("lock")
            .is_some_and(|t| t > restarted)
    });
    let resumed_after = last_hit.lock().expect("lock").map(|t| t - restarted);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    load.join().expect("load");
    let (sent, failed, hits) = (
        sent.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst),
        hits.load(Ordering::SeqCst),
    );
    println!(
        "FIGURES redis SIGKILL under load: {sent} reads sent, {failed} failed, {hits} hits \
         ({hits_before} before the kill), down for {:?}, hits resumed {:?} after the restart",
        restarted - killed_at,
        resumed_after
    );
    assert!(sent_while_down > 0);
    assert_eq!(failed, 0, "a read failed because Redis failed");
    assert!(resumed_after.is_some_and(|d| d < Duration::from_secs(2)));
}

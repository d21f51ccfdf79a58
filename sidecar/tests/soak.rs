//! A bounded soak (not in the default run): steady mixed load against the binary for
//! FERRY_SOAK_S seconds (default 600), sampling RSS and open file descriptors. After the replay
//! window has filled the nonce store (30 s here), neither may keep growing.
//!
//!   FERRY_SOAK_S=600 cargo test -p ferry-sidecar --test soak -- --ignored --nocapture
use ferry_testkit::{self as common, PgServer, RedisServer};
use serde_json::json;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const WINDOW_S: u64 = 30;

fn sample(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

#[test]
#[ignore = "a soak: run with --ignored (FERRY_SOAK_S sets its length)"]
fn no_growth_under_steady_load() {
    let secs: u64 = std::env::var("FERRY_SOAK_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    assert!(
        secs > WINDOW_S * 2,
        "FERRY_SOAK_S must exceed {} s",
        WINDOW_S * 2
    );
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let window = WINDOW_S.to_string();
    let mut sidecar = common::SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[("FERRY_AUTH_MAX_SKEW_S", &window)],
        Stdio::null(),
    );
    let (pid, c) = (sidecar.pid(), sidecar.client.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (c, stop, sent, failed) = (c.clone(), stop.clone(), sent.clone(), failed.clone());
        std::thread::spawn(move || {
            c.block_on(async {
                let workers = (0..8).map(|w| {
                    let (c, stop, sent, failed) = (c.clone(), stop.clone(), sent.clone(), failed.clone());
                    async move {
                        let mut i = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            i += 1;
                            let r = match i % 10 {
                                0 => c.post("/v1/execute", &json!({"sql": "UPDATE items SET price = price WHERE id = $1", "params": [w + 1], "invalidate": {"keys": [format!("s{w}")]}})).await,
                                1..=2 => c.query_async(json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [i % 500 + 1]})).await,
                                _ => c.query_async(json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [i % 50 + 1], "cache": {"ttl_s": 5, "key": format!("s{}", i % 50)}})).await,
                            };
                            sent.fetch_add(1, Ordering::Relaxed);
                            if r.status != 200 {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
                futures::future::join_all(workers).await;
            })
        })
    };
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(5));
        samples.push((start.elapsed().as_secs(), sample(pid)));
    }
    stop.store(true, Ordering::Relaxed);
    load.join().expect("load");
    sidecar.terminate();

    let settled: Vec<_> = samples.iter().filter(|(t, _)| *t >= WINDOW_S * 2).collect();
    let first = settled.first().map(|s| s.1).unwrap_or_default();
    let max_rss = settled.iter().map(|s| s.1 .0).max().unwrap_or(0);
    let max_fds = settled.iter().map(|s| s.1 .1).max().unwrap_or(0);
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!(
        "FIGURES soak {secs} s: {sent} requests ({:.0}/s), {failed} failed; after the {WINDOW_S} s replay \
         window filled: RSS {} KB -> max {} KB, open fds {} -> max {}",
        sent as f64 / secs as f64,
        first.0,
        max_rss,
        first.1,
        max_fds
    );
    assert_eq!(failed, 0);
    // Stated bounds: RSS within 25% + 16 MB of its settled value, fds within 16.
    assert!(
        max_rss <= first.0 + first.0 / 4 + 16 * 1024,
        "RSS grew: {} -> {max_rss} KB",
        first.0
    );
    assert!(
        max_fds <= first.1 + 16,
        "fds grew: {} -> {max_fds}",
        first.1
    );
}

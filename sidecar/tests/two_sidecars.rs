//! A second sidecar against the freshness promise: two binaries share Redis and Postgres;
//! writes with invalidations go through one, concurrent cached reads through the other. A read
//! that starts after a write was acknowledged never returns the pre-write value (the version
//! tokens live in Redis, so every sidecar sees every invalidation). Postgres's rows judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn an_invalidation_through_one_sidecar_is_seen_by_reads_on_the_other() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let start = || SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let (writer, reader) = (start(), start());
    let (w, r) = (writer.client.clone(), reader.client.clone());
    // (version, instant its write was acknowledged)
    let acked: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    // (instant the read started, version it returned, cache status)
    let seen: Arc<Mutex<Vec<(Instant, u64, String)>>> = Arc::default();
    let writes = 60u64;
    r.block_on(async {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers = (0..6).map(|i| {
            let (r, seen, done) = (r.clone(), seen.clone(), done.clone());
            async move {
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    // Half by key, half by tag: both invalidations must cross sidecars.
                    let cache = if i % 2 == 0 {
                        json!({"ttl_s": 300, "key": "nine"})
                    } else {
                        json!({"ttl_s": 300, "key": "nine-t", "tags": ["items9"]})
                    };
                    let started = Instant::now();
                    let a = r
                        .query_async(
                            json!({"sql": "SELECT name FROM items WHERE id = 9", "cache": cache}),
                        )
                        .await;
                    assert_eq!(a.status, 200, "{:?}", a.body);
                    let name = a.body["rows"][0]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let v = name
                        .strip_prefix('v')
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    let status = a.body["cache"].as_str().unwrap_or_default().to_string();
                    seen.lock().expect("lock").push((started, v, status));
                }
            }
        });
        let writer = {
            let (w, acked, done) = (w.clone(), acked.clone(), done.clone());
            async move {
                for n in 1..=writes {
                    let a = w
                        .post(
                            "/v1/execute",
                            &json!({
                                "sql": "UPDATE items SET name = $1 WHERE id = 9",
                                "params": [format!("v{n}")],
                                "invalidate": {"keys": ["nine"], "tags": ["items9"]}
                            }),
                        )
                        .await;
                    assert_eq!(a.status, 200, "{:?}", a.body);
                    assert_eq!(a.body["invalidation"], "done");
                    acked.lock().expect("lock").push((n, Instant::now()));
                    tokio::time::sleep(std::time::Duration::from_millis(15)).await;
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        };
        futures::future::join(futures::future::join_all(readers), writer).await;
    });
    let acked = acked.lock().expect("lock").clone();
    let seen = seen.lock().expect("lock").clone();
    let stale: Vec<_> = seen
        .iter()
        .filter(|(started, v, _)| {
            let newest_acked = acked
                .iter()
                .filter(|(_, at)| at < started)
                .map(|(n, _)| *n)
                .max()
                .unwrap_or(0);
            *v < newest_acked
        })
        .collect();
    let hits = seen.iter().filter(|(_, _, s)| s == "hit").count();
    println!(
        "FIGURES two sidecars: {writes} writes through one, {} reads through the other ({hits} hits): {} stale",
        seen.len(),
        stale.len()
    );
    assert!(hits > 0, "the reads used the cache");
    assert!(
        stale.is_empty(),
        "stale reads across sidecars: {:?}",
        &stale[..stale.len().min(5)]
    );
    let name: String = pg
        .client()
        .query_one("SELECT name FROM items WHERE id = 9", &[])
        .expect("row")
        .get(0);
    assert_eq!(
        name,
        format!("v{writes}"),
        "every acknowledged write is committed"
    );
}

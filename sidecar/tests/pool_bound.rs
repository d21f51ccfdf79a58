//! The pools are bounded: 300 concurrent requests (reads and cache commands) all succeed, and neither Redis nor Postgres
//! ever sees more connections from the sidecar than the configured pool sizes.
use ferry_testkit as common;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const REDIS_POOL: u32 = 4;
const PG_POOL: u32 = 5;

#[test]
fn three_hundred_concurrent_requests_stay_within_the_pools() {
    let stack = common::Stack::start_with(|c| {
        c.redis.pool_size = REDIS_POOL;
        c.postgres.pool_size = PG_POOL;
        c.postgres.checkout_timeout_ms = 5_000;
        c.redis.checkout_timeout_ms = 5_000;
    });

    // Sample both servers' view of the sidecar's connections while the load runs.
    let stop = Arc::new(AtomicBool::new(false));
    let max_redis = Arc::new(AtomicI64::new(0));
    let max_pg = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (stop, max_redis, max_pg) = (stop.clone(), max_redis.clone(), max_pg.clone());
        let redis_url = stack.redis.url();
        let pg_url = stack.pg.url();
        std::thread::spawn(move || {
            let mut r = redis::Client::open(redis_url.as_str())
                .and_then(|c| c.get_connection())
                .expect("sampler redis");
            let mut p = postgres::Client::connect(&pg_url, postgres::NoTls).expect("sampler pg");
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) || samples < 3 {
                let info: String = redis::cmd("INFO")
                    .arg("clients")
                    .query(&mut r)
                    .expect("info");
                let clients: i64 = info
                    .lines()
                    .find_map(|l| l.strip_prefix("connected_clients:"))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("connected_clients");
                // Minus the sampler's own connection.
                max_redis.fetch_max(clients - 1, Ordering::Relaxed);
                let backends: i64 = p
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'",
                        &[],
                    )
                    .expect("pg_stat_activity")
                    .get(0);
                max_pg.fetch_max(backends, Ordering::Relaxed);
                samples += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    let c = &stack.client;
    let answers = c.block_on(async {
        let requests = (0..300).map(|i| async move {
            // Reads (cached and not), and cache commands, which run on each worker's
            // multiplexed connection: all of them count against redis.pool_size.
            match i % 3 {
                0 => c.query_async(json!({"sql": "SELECT name, pg_sleep(0.01)::text AS s FROM items WHERE id = $1",
                       "params": [i % 20 + 1], "cache": {"ttl_s": 60}})).await,
                1 => c.query_async(json!({"sql": "SELECT name, pg_sleep(0.01)::text AS s FROM items WHERE id = $1",
                       "params": [i]})).await,
                _ => c.post("/v1/cache", &json!({"op": "set", "key": format!("k{i}"), "value": "v"})).await,
            }
        });
        futures::future::join_all(requests).await
    });
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");

    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of 300 failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    let hits = answers.iter().filter(|a| a.body["cache"] == "hit").count();
    let (redis_peak, pg_peak) = (
        max_redis.load(Ordering::Relaxed),
        max_pg.load(Ordering::Relaxed),
    );
    println!("300 ok, {hits} hits; peak redis clients {redis_peak}/{REDIS_POOL}, peak postgres backends {pg_peak}/{PG_POOL}");
    assert!(
        redis_peak <= i64::from(REDIS_POOL),
        "redis clients {redis_peak} > {REDIS_POOL}"
    );
    assert!(
        pg_peak <= i64::from(PG_POOL),
        "postgres backends {pg_peak} > {PG_POOL}"
    );
    assert!(
        pg_peak >= 1 && redis_peak >= 1,
        "the sampler saw the pools in use"
    );
    assert!(stack.sidecar.state.redis_pool_connections() <= REDIS_POOL);
}

//! A Postgres that stops answering (every Postgres process SIGSTOPped: a hung server, or a
//! network that drops packets) under the workers' event-loop sessions, on the binary: uncached
//! reads answer fast with a JSON error at the deadline instead of hanging, cached reads keep
//! being served from Redis, and once Postgres answers again reads recover without a restart
//! and Postgres holds no more Ferry sessions than the pool.
use ferry_testkit::{wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn a_frozen_postgres_gets_fast_answers_and_recovery() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_POSTGRES_POOL_SIZE", "4"),
            ("FERRY_SERVER_REQUEST_TIMEOUT_MS", "1000"),
            ("FERRY_POSTGRES_CHECKOUT_TIMEOUT_MS", "500"),
        ],
        Stdio::null(),
    );
    let c = &s.client;
    let plain = |id: i32| json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [id]});
    let cached = json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 600}});
    // Warm: the event-loop sessions exist, and one entry is cached.
    for id in 1..20 {
        assert_eq!(c.query(plain(id)).status, 200);
    }
    c.query(cached.clone());
    assert_eq!(c.query(cached.clone()).body["cache"], "hit");

    let pids = pg.freeze();
    let frozen = Instant::now();
    // 16 concurrent uncached reads: each answers, with a JSON error, near the deadline.
    let answers = c.block_on(async {
        let reads = (1..=16).map(|id| {
            let body = plain(id);
            async move {
                let t = Instant::now();
                (c.post("/v1/query", &body).await, t.elapsed())
            }
        });
        futures::future::join_all(reads).await
    });
    let hit = c.query(cached.clone());
    let slowest = answers.iter().map(|(_, t)| *t).max().unwrap_or_default();
    pg.thaw(&pids);
    for (a, _) in &answers {
        assert!(matches!(a.status, 503 | 504), "{}: {:?}", a.status, a.body);
        assert!(a.body["error"]["code"].is_string(), "{:?}", a.body);
    }
    assert!(
        slowest < Duration::from_millis(2500),
        "an answer took {slowest:?} with a 1 s deadline"
    );
    assert_eq!(hit.status, 200, "cached reads are served: {:?}", hit.body);
    assert_eq!(hit.body["cache"], "hit");

    // Back without a restart.
    let recovered = Instant::now();
    wait_until("reads to recover", Duration::from_secs(20), || {
        (1..=8).all(|id| c.query(plain(id)).status == 200)
    });
    println!(
        "FIGURES frozen: 16 reads answered 503/504 within {slowest:?} (deadline 1 s) after \
         {:?} frozen; cached reads served; recovered {:?} after SIGCONT",
        frozen.elapsed() - recovered.elapsed(),
        recovered.elapsed()
    );
    let backends = pg.sidecar_backends();
    assert!(backends <= 4, "{backends} Ferry sessions for a pool of 4");
}

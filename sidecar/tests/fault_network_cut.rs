//! The network to Redis or Postgres cut mid-request (the proxy drops every connection): the
//! request is answered, quickly, with a JSON error (or, for Redis, served from Postgres); no
//! hang, no panic; after the link heals everything works again.
use ferry_testkit::{self as common, CutProxy, PgServer, RedisServer, Sidecar};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[test]
fn cuts_mid_request_are_answered_and_healed() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let redis_proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], redis.port)));
    let pg_proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], pg.port)));
    let mut config = common::sidecar::test_config(&redis, &pg);
    config.redis.url = format!("redis://{}/", redis_proxy.addr).into();
    config.postgres.url = format!("postgres://postgres@{}/postgres", pg_proxy.addr).into();
    let sidecar = Sidecar::start(config);
    let c = common::Client::new(&sidecar.base_url(), common::SECRET);
    let cached = json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 300}});
    assert_eq!(c.query(cached.clone()).body["cache"], "miss");

    // Postgres link cut while a statement runs.
    let slow = {
        let c = c.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = c.query(json!({"sql": "SELECT pg_sleep(3)::text AS s"}));
            (r, t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    pg_proxy.cut();
    let (r, took) = slow.join().expect("slow request");
    println!(
        "FIGURES postgres cut mid-query: answered {} {} after {took:?}",
        r.status,
        r.code()
    );
    assert!(matches!(r.status, 502..=504), "{:?}", r.body);
    assert!(!r.code().is_empty());
    assert!(
        took < Duration::from_millis(2500),
        "answered before the statement would have ended"
    );
    // Cached reads still served while Postgres is unreachable.
    assert_eq!(c.query(cached.clone()).body["cache"], "hit");

    // Redis link cut: reads are served from Postgres once it is back.
    pg_proxy.heal();
    redis_proxy.cut();
    let t = Instant::now();
    let r = c.query(cached.clone());
    println!(
        "FIGURES redis cut: read answered {} ({}) after {:?}",
        r.status,
        r.body["cache"],
        t.elapsed()
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["cache"], "bypass");
    assert_eq!(r.body["rows"][0]["name"], "item 1");

    // Healed: hits again, without a sidecar restart.
    redis_proxy.heal();
    common::wait_until("hits after healing", Duration::from_secs(10), || {
        c.query(cached.clone()).body["cache"] == "hit"
    });
    assert_eq!(c.query(json!({"sql": "SELECT 2 AS two"})).status, 200);
}

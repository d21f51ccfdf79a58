//! Prometheus metrics on the admin listener: requests by route and status, latency
//! histograms, cache outcomes, single-flight waits, pool state and checkout time, errors.
use ferry_testkit::{self as common, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn metrics_are_scraped_from_the_admin_listener() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let mut sidecar = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[("FERRY_REDIS_POOL_SIZE", "3")],
        Stdio::null(),
    );
    let c = sidecar.client.clone();
    let q = json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 60}});
    c.query(q.clone());
    c.query(q);
    c.query(json!({"sql": "SELECT 1 +"}));
    let admin = common::Client::new(&format!("http://127.0.0.1:{}", sidecar.admin_port), "x");
    let text = admin.block_on(async {
        admin
            .http
            .get(format!("{}/metrics", admin.base))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text")
    });
    for needle in [
        "ferry_requests_total{route=\"/v1/query\",status=\"200\"} 2",
        "ferry_requests_total{route=\"/v1/query\",status=\"400\"} 1",
        "ferry_request_seconds_bucket{route=\"/v1/query\",le=\"+Inf\"} 3",
        "ferry_cache_total{status=\"hit\"} 1",
        "ferry_cache_total{status=\"miss\"} 1",
        "ferry_errors_total{code=\"sql_error\"} 1",
        "ferry_pool_connections{pool=\"redis\",state=\"max\"} 3",
        "ferry_pool_connections{pool=\"postgres\",state=\"max\"} 10",
        "ferry_pool_checkout_seconds_count{pool=\"postgres\"}",
        "ferry_singleflight_joined_total 0",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    // Open Postgres connections count every one the sidecar holds (the r2d2 pool's and the
    // workers' event-loop sessions), as Postgres itself sees them.
    let open = text
        .lines()
        .find_map(|l| l.strip_prefix("ferry_pool_connections{pool=\"postgres\",state=\"open\"} "))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .expect("postgres open gauge");
    assert_eq!(open, pg.sidecar_backends(), "{text}");
    assert!(
        open >= 2,
        "the pool's connection and a worker's session: {open}"
    );
    // The public port does not serve metrics.
    assert_eq!(c.get("/metrics").status, 404);
    sidecar.terminate();
}

//! Redis down never fails a read Postgres can serve; writes made while it is down are
//! invalidated as soon as it is back, and until then no read returns the pre-write value.
use ferry_testkit as common;
use serde_json::json;
use std::time::{Duration, Instant};

fn read(c: &common::Client, id: i64) -> common::client::Answer {
    c.query(json!({
        "sql": "SELECT name FROM items WHERE id = $1",
        "params": [id],
        "cache": {"ttl_s": 300, "key": format!("item:{id}")}
    }))
}

/// Reads until one is a hit, asserting every read succeeds with `want`; returns the count.
fn read_until_hit(c: &common::Client, id: i64, want: &str, within: Duration) -> usize {
    let start = Instant::now();
    let mut n = 0;
    loop {
        let r = read(c, id);
        n += 1;
        assert_eq!(r.status, 200, "read {n}: {:?}", r.body);
        assert_eq!(r.body["rows"][0]["name"], want, "read {n}: {:?}", r.body);
        if r.body["cache"] == "hit" {
            return n;
        }
        assert!(
            start.elapsed() < within,
            "no hit within {within:?}: {:?}",
            r.body
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn redis_killed_then_restarted() {
    let mut stack = common::Stack::start();
    let c = &stack.client;
    assert_eq!(read(c, 1).body["cache"], "miss");
    assert_eq!(read(c, 1).body["cache"], "hit");

    stack.redis.kill();
    for _ in 0..20 {
        let r = read(c, 1);
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["cache"], "bypass");
        assert_eq!(r.body["rows"][0]["name"], "item 1");
    }
    // A write while Redis is down: acknowledged, invalidation deferred, never lost.
    let w = c.execute(json!({
        "sql": "UPDATE items SET name = 'while down' WHERE id = 1",
        "invalidate": {"keys": ["item:1"]}
    }));
    assert_eq!(w.status, 200, "{:?}", w.body);
    assert_eq!(w.body["invalidation"], "deferred");
    assert_eq!(read(c, 1).body["rows"][0]["name"], "while down");

    stack.redis.restart();
    // The pool reconnects by itself (no sidecar restart) and hits resume.
    read_until_hit(c, 1, "while down", Duration::from_secs(5));
    assert_eq!(stack.sidecar.state.pending_invalidations(), 0);
    let r = c.query(json!({"sql": "SELECT 1 AS one", "cache": {"ttl_s": 5}}));
    assert_eq!(r.body["cache"], "miss");
}

#[test]
fn deferred_invalidation_reaches_a_redis_that_kept_its_data() {
    let stack = common::Stack::start();
    let c = &stack.client;
    assert_eq!(read(c, 11).body["cache"], "miss");
    assert_eq!(read(c, 11).body["cache"], "hit");

    // SIGSTOP: Redis keeps the old entry but cannot answer, like a partition.
    stack.redis.pause();
    let w = c.execute(json!({
        "sql": "UPDATE items SET name = 'new name' WHERE id = 11",
        "invalidate": {"keys": ["item:11"]}
    }));
    assert_eq!(w.status, 200, "{:?}", w.body);
    assert_eq!(w.body["invalidation"], "deferred");
    for _ in 0..5 {
        let r = read(c, 11);
        assert_eq!(r.body["rows"][0]["name"], "new name", "{:?}", r.body);
        assert_eq!(r.body["cache"], "bypass");
    }

    // SIGCONT: the old entry is still in Redis until the deferred invalidation lands.
    stack.redis.resume();
    let reads = read_until_hit(c, 11, "new name", Duration::from_secs(10));
    assert!(reads >= 1);
    assert_eq!(stack.sidecar.state.pending_invalidations(), 0);
}

#[test]
fn readyz_reports_which_dependency_is_down() {
    let mut stack = common::Stack::start();
    common::wait_until("the first readiness probe", Duration::from_secs(5), || {
        stack.client.get("/readyz").status == 200
    });
    stack.redis.kill();
    // /readyz answers from a snapshot refreshed in the background (100 ms in tests).
    common::wait_until("readyz to see redis down", Duration::from_secs(5), || {
        stack.client.get("/readyz").status == 503
    });
    let r = stack.client.get("/readyz");
    assert_eq!(
        r.body,
        json!({"ready": false, "redis": "down", "postgres": "up",
               "pending_invalidations": 0, "cache_bypassed": false})
    );
    stack.redis.restart();
    common::wait_until("readyz to recover", Duration::from_secs(5), || {
        stack.client.get("/readyz").status == 200
    });
}

/// While Redis is down and the breaker open, no request waits for a Redis connection: end
/// users' reads (whose rate limit asks Redis first) are served from Postgres under the sidecar's
/// own bucket, and cache commands are refused with a 503 at once. The sidecar's own count of
/// Redis connection checkouts judges: it does not move until the breaker's window has passed
/// (a window longer than the test). Before: each of them waited `redis.checkout_timeout_ms`
/// for a pooled connection, holding an in-flight slot meanwhile.
#[test]
fn while_the_breaker_is_open_nothing_waits_for_redis() {
    let mut redis = common::RedisServer::start();
    let pg = common::PgServer::start();
    pg.setup_demo_schema();
    let app_url = pg.url().replace("postgres@", "ferry_app@");
    let env = [
        ("FERRY_DATABASE_URL", app_url.as_str()),
        ("FERRY_IDENTITY_ROLES", "authenticated"),
        ("FERRY_IDENTITY_ALLOW_RAW_SQL", "true"),
        ("FERRY_IDENTITY_RATE_PER_S", "1000"),
        ("FERRY_IDENTITY_BURST", "1000"),
        ("FERRY_REDIS_RETRY_AFTER_FAILURE_MS", "600000"),
    ];
    let s = common::SidecarProcess::start(
        env!("CARGO_BIN_EXE_ferry-sidecar"),
        &redis.url(),
        &pg.url(),
        &env,
        std::process::Stdio::null(),
    );
    let c = &s.client;
    let notes = || {
        c.query(json!({
            "sql": "SELECT body FROM notes ORDER BY id",
            "identity": {"role": "authenticated", "claims": {"sub": "bob"}},
        }))
    };
    assert_eq!(notes().status, 200);
    redis.kill();
    // The first requests find Redis gone and open the breaker.
    for _ in 0..3 {
        assert_eq!(notes().status, 200);
    }
    let checkouts = || {
        s.metric("ferry_pool_checkout_seconds_count{pool=\"redis\"}")
            .unwrap_or(0.0)
    };
    let before = checkouts();
    for i in 0..20 {
        let r = notes();
        assert_eq!(r.status, 200, "read {i}: {}", r.body);
        assert_eq!(r.body["rows"], json!([{"body": "bob's note"}]), "read {i}");
    }
    for op in [
        json!({"op": "get", "key": "k"}),
        json!({"op": "incr", "key": "n"}),
    ] {
        for _ in 0..5 {
            let r = c.cache(op.clone());
            assert_eq!(
                (r.status, r.code()),
                (503, "cache_unavailable"),
                "{}",
                r.body
            );
        }
    }
    assert_eq!(
        checkouts(),
        before,
        "a Redis connection was asked for while the breaker was open"
    );
}

//! The holder of a captured signed cache write (an INCR, which counts twice if it runs twice)
//! replays it to a second sidecar at the moment that sidecar's Redis is misbehaving. A cache
//! write is guarded by Redis's record of its nonce alone (Postgres keeps no row for it), so
//! the check may not be skipped for it, as it may for a read: no check, no write. Sidecar A
//! reaches Redis directly, sidecar B through a proxy the test resets or cuts. Redis's own
//! count judges.
use ferry_testkit::client::{nonce, now_s};
use ferry_testkit::{CutProxy, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

struct Two {
    redis: RedisServer,
    _pg: PgServer,
    proxy: CutProxy,
    a: SidecarProcess,
    b: SidecarProcess,
}

fn setup() -> Two {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], redis.port)));
    let via_proxy = format!("redis://{}/", proxy.addr);
    let a = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let b = SidecarProcess::start(BIN, &via_proxy, &pg.url(), &[], Stdio::null());
    Two {
        redis,
        _pg: pg,
        proxy,
        a,
        b,
    }
}

/// The counter's value in Redis.
fn counter(t: &Two, key: &str) -> Option<String> {
    let mut conn = redis::Client::open(t.redis.url().as_str())
        .and_then(|c| c.get_connection())
        .expect("redis");
    redis::cmd("GET")
        .arg(format!("ferry:k:{key}"))
        .query(&mut conn)
        .expect("get")
}

/// An INCR accepted by A, then `fault` done to B's Redis, then the very same request to B.
/// Returns the replay's (status, code), and the replay to send again.
fn replayed_after<'a>(
    t: &'a Two,
    key: &str,
    fault: impl FnOnce(),
) -> ((u16, String), impl Fn() -> (u16, String) + 'a) {
    // B has its connections open, as under traffic.
    let warm = t.b.client.cache(json!({"op": "get", "key": "warm"}));
    assert_eq!(warm.status, 200, "{}", warm.body);
    let body = serde_json::to_vec(&json!({"op": "incr", "key": key})).expect("json");
    let h =
        t.a.client
            .headers_for("POST", "/v1/cache", &body, now_s(), &nonce());
    let first = t.a.client.raw("POST", "/v1/cache", body.clone(), &h);
    assert_eq!(first.status, 200, "{}", first.body);
    fault();
    let replay = move || {
        let r = t.b.client.raw("POST", "/v1/cache", body.clone(), &h);
        (r.status, r.code().to_string())
    };
    (replay(), replay)
}

/// The network resets B's connections to Redis just before the replay reaches it: its first
/// attempt at the check fails with "connection reset".
#[test]
fn a_replayed_cache_write_is_refused_when_the_check_meets_a_reset_connection() {
    let t = setup();
    let ((status, code), _) = replayed_after(&t, "reset", || t.proxy.reset());
    assert_eq!(
        counter(&t, "reset").as_deref(),
        Some("1"),
        "the INCR ran twice"
    );
    // Asked again on a fresh connection, the check tells its own first attempt from A's
    // request by its token: a replay verdict, and nothing runs (a caller's own request retried
    // right after a reset goes on: `fault_redis_clients_killed.rs`).
    assert_eq!((status, code.as_str()), (401, "auth_replayed"));
}

/// B's Redis was out for a moment, and B's breaker is still open when the replay arrives
/// (Redis is back): refused at once, nothing run. Once the breaker's window has passed, the
/// request that probes Redis carries its check: the replay sent again is refused as one.
#[test]
fn a_replayed_cache_write_is_refused_while_the_breaker_is_open() {
    let t = setup();
    let ((status, code), again) = replayed_after(&t, "breaker", || {
        t.proxy.cut();
        let failed = t.b.client.cache(json!({"op": "get", "key": "warm"}));
        assert_eq!(failed.status, 503, "{}", failed.body);
        t.proxy.heal();
    });
    assert_eq!((status, code.as_str()), (503, "cache_unavailable"));
    // Past the window (`redis.retry_after_failure_ms`, 250 ms).
    std::thread::sleep(Duration::from_millis(400));
    let (status, code) = again();
    assert_eq!((status, code.as_str()), (401, "auth_replayed"));
    assert_eq!(
        counter(&t, "breaker").as_deref(),
        Some("1"),
        "the INCR ran twice"
    );
    // Not a refusal of everything: a fresh write through B goes on.
    let fresh = t.b.client.cache(json!({"op": "incr", "key": "breaker"}));
    assert_eq!(fresh.status, 200, "{}", fresh.body);
    assert_eq!(counter(&t, "breaker").as_deref(), Some("2"));
}

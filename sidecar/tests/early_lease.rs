//! A read that a sidecar guesses will miss (it has not lately seen the entry) takes its fill
//! lease in its first lookup. When the guess is wrong, or the read goes no further, the lease
//! must not outlive it: a lease left in Redis makes every other sidecar's miss of that read
//! wait for it (up to the lease's 2 s) instead of filling. Two adversaries, each on a sidecar
//! that has never seen the entry: reads that hit an entry another sidecar filled, and a
//! captured request replayed, and a read that bypasses the cache (its `after` is ahead of the
//! change stream) with a slow query. Redis's own log (MONITOR) shows the leases taken; its keys
//! show none left.
mod change_stream_common;

use ferry_testkit::client::{nonce, now_s};
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn setup() -> (RedisServer, PgServer, SidecarProcess, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let start = || SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let (a, b) = (start(), start());
    (redis, pg, a, b)
}

/// A cached read of one item, counted by Postgres (`ferry_test_touch`) each time it runs there.
fn read(id: i64) -> serde_json::Value {
    json!({"sql": "SELECT id, name, ferry_test_touch() AS t FROM items WHERE id = $1",
           "params": [id], "cache": {"ttl_s": 60, "tables": ["items"]}})
}

/// Fill leases in Redis now.
fn leases(redis: &RedisServer) -> Vec<String> {
    let mut conn = redis.conn();
    redis::cmd("KEYS")
        .arg("*lease:*")
        .query::<Vec<String>>(&mut conn)
        .expect("KEYS")
        .into_iter()
        .filter(|k| !k.ends_with(":waiting"))
        .collect()
}

/// Waits up to 1 s (half a lease's life: one never released lives 2 s) for no lease to be
/// left; the ones left then.
fn leases_left_after_a_second(redis: &RedisServer) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let left = leases(redis);
        if left.is_empty() || Instant::now() > until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The commands clients sent (not those scripts ran) since MONITOR began, until Redis has
/// been quiet for half a second, or for 3 s at most (a change stream's heartbeats never let
/// it be quiet).
fn monitored(mut conn: redis::Connection) -> Vec<String> {
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("read timeout");
    let mut lines = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while let (true, Ok(v)) = (Instant::now() < until, conn.recv_response()) {
        if let Ok(line) = redis::from_redis_value::<String>(v) {
            if !line.contains(" lua]") {
                lines.push(line);
            }
        }
    }
    lines
}

fn lease_sets(log: &[String]) -> usize {
    log.iter()
        .filter(|l| l.contains("\"SET\"") && l.contains(":lease:") && l.contains("\"NX\""))
        .count()
}

fn monitor(redis: &RedisServer) -> redis::Connection {
    let mut m = redis.conn();
    redis::cmd("MONITOR").exec(&mut m).expect("MONITOR");
    m
}

#[test]
fn hits_guessed_to_miss_leave_no_lease_behind() {
    let (redis, pg, a, b) = setup();
    let n = 30;
    for id in 1..=n {
        let r = b.client.query(read(id));
        assert_eq!(r.body["cache"], "miss", "{}", r.body);
    }
    // Let B's write-backs land.
    std::thread::sleep(Duration::from_millis(300));
    let m = monitor(&redis);
    for id in 1..=n {
        let r = a.client.query(read(id));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["cache"], "hit", "read {id} on A: {}", r.body);
    }
    let left = leases_left_after_a_second(&redis);
    let log = monitored(m);
    assert_eq!(
        lease_sets(&log),
        n as usize,
        "A had never seen these entries: each read takes its lease in its lookup"
    );
    assert!(left.is_empty(), "leases left behind by hits: {left:?}");
    // Seen now: A's next reads take no lease.
    let m = monitor(&redis);
    for id in 1..=n {
        assert_eq!(a.client.query(read(id)).body["cache"], "hit");
    }
    assert_eq!(
        lease_sets(&monitored(m)),
        0,
        "entries A saw are guessed present"
    );
    assert_eq!(pg.reads(), n, "only B's misses ran on Postgres");
}

#[test]
fn a_replay_guessed_to_miss_leaves_no_lease_behind() {
    let (redis, pg, a, b) = setup();
    for id in 1..=10i64 {
        let body = serde_json::to_vec(&read(id)).expect("json");
        let h = a
            .client
            .headers_for("POST", "/v1/query", &body, now_s(), &nonce());
        let first = a.client.raw("POST", "/v1/query", body.clone(), &h);
        assert_eq!(first.status, 200, "{}", first.body);
        let m = monitor(&redis);
        let replay = b.client.raw("POST", "/v1/query", body, &h);
        assert_eq!(replay.status, 401, "{}", replay.body);
        assert_eq!(replay.code(), "auth_replayed");
        let left = leases_left_after_a_second(&redis);
        assert_eq!(
            lease_sets(&monitored(m)),
            1,
            "B had never seen the entry: the replay's lookup takes the lease"
        );
        assert!(left.is_empty(), "replay {id} left {left:?}");
    }
    assert_eq!(
        pg.reads(),
        10,
        "each read ran once on Postgres; no replay ran"
    );
}

#[test]
fn a_read_that_bypasses_lets_its_lease_go_before_its_query() {
    let redis = RedisServer::start();
    let pg = change_stream_common::logical_pg();
    let s = change_stream_common::start(&redis, &pg);
    // 1.5 s on Postgres; `after` a position the stream has not reached: answered uncached.
    let slow = json!({"sql": "SELECT pg_sleep(1.5)::text AS slept, 1 AS n",
                      "cache": {"ttl_s": 60, "key": "slow:1"}, "after": "FF/0"});
    let m = monitor(&redis);
    let seen = std::thread::scope(|scope| {
        let read = scope.spawn(|| s.client.query(slow.clone()));
        // Watch the leases while the query runs (0.3 s to 1.2 s in).
        std::thread::sleep(Duration::from_millis(300));
        let mut seen = Vec::new();
        let until = Instant::now() + Duration::from_millis(900);
        while Instant::now() < until {
            seen.extend(leases(&redis));
            std::thread::sleep(Duration::from_millis(50));
        }
        let r = read.join().expect("the read");
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["cache"], "bypass", "{}", r.body);
        seen
    });
    assert_eq!(
        lease_sets(&monitored(m)),
        1,
        "the read, never seen, takes its lease in its lookup"
    );
    assert!(
        seen.is_empty(),
        "a read that does not fill held its lease through its query: {seen:?}"
    );
}

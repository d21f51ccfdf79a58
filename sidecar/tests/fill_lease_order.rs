//! A miss's lookup that counts reaches Redis after its fill lease's `SET`, never before: run
//! first, it could miss another sidecar's fill whose lease was let go in between, and the same
//! query would run twice. A miss of an entry this sidecar has not lately seen takes the lease in
//! front of its first lookup (one lookup in all); a miss of an entry it has seen (since
//! invalidated) looks up, then takes the lease with a second lookup behind it. And a miss of a
//! new entry costs Redis two messages, the lease's release riding with the write-back (Redis's
//! own count of read events judges). Redis's own log of the commands it ran (MONITOR) judges
//! the order, for misses through the sidecar binary.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

/// The commands Redis ran for its clients (not inside scripts), in order, until it has been
/// quiet for half a second.
fn monitored(mut conn: redis::Connection) -> Vec<String> {
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("read timeout");
    let mut lines = Vec::new();
    while let Ok(v) = conn.recv_response() {
        if let Ok(line) = redis::from_redis_value::<String>(v) {
            if !line.contains(" lua]") {
                lines.push(line);
            }
        }
    }
    lines
}

/// Where each command of `log` that matches `what` ran.
fn positions(log: &[String], what: impl Fn(&str) -> bool) -> Vec<usize> {
    log.iter()
        .enumerate()
        .filter(|(_, l)| what(l))
        .map(|(i, _)| i)
        .collect()
}

fn is_lease(l: &str) -> bool {
    l.contains("] \"SET\"") && l.contains(":lease:") && l.contains("\"NX\"")
}

/// The commands of one miss: where its lease was taken, its lookups (GETs), its write-back.
fn one_miss(redis: &RedisServer, s: &SidecarProcess, req: &serde_json::Value) -> Vec<String> {
    let mut monitor = redis.conn();
    redis::cmd("MONITOR")
        .exec(&mut monitor)
        .expect("MONITOR is answered");
    let a = s.client.query(req.clone());
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["cache"], "miss", "{}", a.body);
    monitored(monitor)
}

/// Redis, Postgres with the demo schema, and the sidecar binary over them.
fn stack() -> (RedisServer, PgServer, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    (redis, pg, s)
}

/// Where a miss's lease, lookups (GETs) and write-back are in `log`, and the log to show.
fn order(log: &[String]) -> (Vec<usize>, Vec<usize>, Vec<usize>, String) {
    (
        positions(log, is_lease),
        positions(log, |l| l.contains("] \"GET\"")),
        positions(log, |l| l.contains("\"EVAL")),
        log.join("\n"),
    )
}

#[test]
fn a_miss_of_a_new_entry_looks_up_once_behind_its_lease() {
    let (redis, pg, s) = stack();
    let req = json!({"sql": "SELECT ferry_test_touch() AS n", "cache": {"ttl_s": 60}});
    let log = one_miss(&redis, &s, &req);
    let (lease, gets, write_back, shown) = order(&log);
    assert_eq!(lease.len(), 1, "one lease; Redis ran:\n{shown}");
    assert_eq!(gets.len(), 1, "one lookup; Redis ran:\n{shown}");
    assert!(
        lease[0] < gets[0] && write_back.first().is_some_and(|w| gets[0] < *w),
        "expected the lease, the lookup behind it, then the write-back; Redis ran:\n{shown}"
    );
    assert_eq!(pg.reads(), 1, "one query ran on Postgres");
}

#[test]
fn a_miss_of_an_entry_seen_looks_again_only_after_its_lease_is_taken() {
    let (redis, pg, s) = stack();
    let req =
        json!({"sql": "SELECT ferry_test_touch() AS n", "cache": {"ttl_s": 60, "key": "order:1"}});
    assert_eq!(s.client.query(req.clone()).body["cache"], "miss");
    let hit = s.client.query(req.clone());
    assert_eq!(hit.body["cache"], "hit", "{}", hit.body);
    let w = s.client.execute(json!({
        "sql": "UPDATE items SET name = name WHERE id = 1", "invalidate": {"keys": ["order:1"]}
    }));
    assert_eq!(w.status, 200, "{}", w.body);
    let log = one_miss(&redis, &s, &req);
    let (lease, gets, write_back, shown) = order(&log);
    assert_eq!(lease.len(), 1, "one lease; Redis ran:\n{shown}");
    assert!(
        gets.len() == 2
            && gets[0] < lease[0]
            && lease[0] < gets[1]
            && write_back.first().is_some_and(|w| gets[1] < *w),
        "expected a lookup, the lease, a lookup behind it, then the write-back; Redis ran:\n{shown}"
    );
    assert_eq!(pg.reads(), 2, "the fill, then the miss after the write");
}

/// A miss of a new entry costs Redis two messages: the lookup with the lease in front of it,
/// and the write-back with the lease's release behind it (a lease taken after the lookup made
/// three, a release of its own four).
#[test]
fn a_miss_costs_two_messages_to_redis() {
    let (redis, _pg, s) = stack();
    let miss = |i: usize| {
        let a = s.client.query(json!({
            "sql": "SELECT $1::int AS n", "params": [i], "cache": {"ttl_s": 60}
        }));
        assert_eq!(a.body["cache"], "miss", "{}", a.body);
    };
    miss(0);
    let before = redis.info_count("stats", "total_reads_processed");
    let n = 100;
    for i in 1..=n {
        miss(i);
    }
    // Less this probe's own INFO message; background work adds a few.
    let per_miss =
        (redis.info_count("stats", "total_reads_processed") - before - 1) as f64 / n as f64;
    println!("FIGURES a miss: {per_miss:.2} messages to Redis");
    assert!(per_miss < 2.5, "{per_miss:.2} messages per miss");
}

//! A miss looks its entry up again behind its fill lease, and that second lookup reaches Redis
//! after the lease's `SET`, never before: run first, it could miss another sidecar's fill
//! whose lease was let go in between, and the same query would run twice. And a miss costs
//! Redis three messages, the lease's release riding with the write-back (Redis's own count of
//! read events judges). Redis's own log of
//! the commands it ran (MONITOR) judges, for a miss through the sidecar binary.
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

#[test]
fn a_miss_looks_again_only_after_its_lease_is_taken() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let mut monitor = redis.conn();
    redis::cmd("MONITOR")
        .exec(&mut monitor)
        .expect("MONITOR is answered");

    let req = json!({"sql": "SELECT ferry_test_touch() AS n", "cache": {"ttl_s": 60}});
    let a = s.client.query(req.clone());
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["cache"], "miss");
    let log = monitored(monitor);

    let lease = log
        .iter()
        .position(|l| l.contains("\"SET\"") && l.contains(":lease:") && l.contains("\"NX\""))
        .unwrap_or_else(|| panic!("no fill lease taken; Redis ran:\n{}", log.join("\n")));
    let write_back = log
        .iter()
        .position(|l| l.contains("\"EVAL"))
        .unwrap_or_else(|| panic!("no write-back; Redis ran:\n{}", log.join("\n")));
    let looked_before = log[..lease].iter().any(|l| l.contains("\"GET\""));
    let looked_after = log[lease..write_back].iter().any(|l| l.contains("\"GET\""));
    assert!(
        looked_before && looked_after,
        "expected a lookup, the lease, a lookup behind it, then the write-back; Redis ran:\n{}",
        log.join("\n")
    );
    assert_eq!(pg.reads(), 1, "one query ran on Postgres");
}

/// A miss costs Redis three messages: the lookup, the lease with a second lookup behind it,
/// and the write-back with the lease's release behind it (a release of its own made four).
#[test]
fn a_miss_costs_three_messages_to_redis() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
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
    assert!(per_miss < 3.5, "{per_miss:.2} messages per miss");
}

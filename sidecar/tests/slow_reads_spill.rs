//! A worker's event-loop sessions are few (three quarters of `postgres.pool_size`, shared by
//! the workers). A read waits in line for one of its worker's own, which is cheap while they
//! turn over; but slow statements may hold them all. The adversary: a caller's slow reads take
//! every session of the worker, while a write holds the pooled share for a moment. Another
//! caller's read on that worker must not wait for the slow reads past the checkout timeout: it
//! takes the pooled connection once that is free. Postgres's own answer judges, and the
//! sidecar's counter of such reads.

use ferry_testkit as common;
use serde_json::json;
use std::time::{Duration, Instant};

/// `ferry_postgres_reads_spilled_total` of the sidecars in this test process.
fn spilled() -> u64 {
    let text = ferry_sidecar::metrics::global().render(&[]);
    text.lines()
        .find_map(|l| l.strip_prefix("ferry_postgres_reads_spilled_total "))
        .and_then(|n| n.parse().ok())
        .expect("the counter is rendered")
}

/// Waits until Postgres runs `n` of the sidecar's statements containing `fragment`.
fn running(admin: &mut postgres::Client, fragment: &str, n: i64) {
    let started = Instant::now();
    loop {
        let now: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'ferry-sidecar' AND state = 'active' \
                   AND strpos(query, $1) > 0",
                &[&fragment],
            )
            .expect("activity")
            .get(0);
        if now == n {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{fragment}: {now} running, not {n}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_read_behind_slow_reads_holding_its_workers_sessions_is_served_from_the_pooled_share() {
    let stack = common::Stack::start_with(|c| {
        // One worker: 3 event-loop sessions, 1 pooled connection.
        c.server.workers = 1;
        c.postgres.pool_size = 4;
        c.postgres.checkout_timeout_ms = 1_000;
    });
    let mut admin = stack.pg.client();
    let before = spilled();
    let base = stack.sidecar.base_url();
    let slow = std::thread::spawn(move || {
        let c = common::Client::new(&base, common::SECRET);
        c.block_on(futures::future::join_all((0..3).map(|i| {
            c.query_async(json!({"sql": format!("SELECT pg_sleep(3)::text AS s, {i} AS i")}))
        })))
    });
    running(&mut admin, "pg_sleep(3)", 3);

    // The pooled connection is busy when the read first asks for it (a write, 0.6 s).
    let base = stack.sidecar.base_url();
    let write = std::thread::spawn(move || {
        let c = common::Client::new(&base, common::SECRET);
        c.block_on(c.post(
            "/v1/execute",
            &json!({"sql": "UPDATE items SET name = name \
                            WHERE id = 1 AND pg_sleep(0.6)::text = ''"}),
        ))
    });
    running(&mut admin, "pg_sleep(0.6)", 1);
    let fast = stack
        .client
        .query(json!({"sql": "SELECT 40 + 2 AS answer"}));
    assert_eq!(
        (fast.status, fast.body["rows"][0]["answer"].clone()),
        (200, json!(42)),
        "served beside the slow reads: {}",
        fast.body
    );
    assert_eq!(spilled() - before, 1, "the read took the pooled path");
    let w = write.join().expect("write");
    assert_eq!(w.status, 200, "{}", w.body);
    for a in slow.join().expect("slow reads") {
        assert_eq!(a.status, 200, "{}", a.body);
    }
}

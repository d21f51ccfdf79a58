//! A worker's event-loop sessions are few (three quarters of `postgres.pool_size`, shared by
//! the workers). A read waits in line for one of its worker's own, which is cheap while they
//! turn over; but slow reads may hold them all. The adversary: a caller's slow statements take
//! every session of the worker. Another caller's read on that worker must not wait for them
//! past the checkout timeout while the pooled share has a connection to spare: it is served
//! there. Postgres's own answer judges.

use ferry_testkit as common;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_read_behind_slow_reads_holding_its_workers_sessions_is_served_from_the_pooled_share() {
    let stack = common::Stack::start_with(|c| {
        // One worker: 3 event-loop sessions, 1 pooled connection.
        c.server.workers = 1;
        c.postgres.pool_size = 4;
        c.postgres.checkout_timeout_ms = 1_000;
    });
    let base = stack.sidecar.base_url();
    let slow = std::thread::spawn(move || {
        let c = common::Client::new(&base, common::SECRET);
        c.block_on(futures::future::join_all((0..3).map(|i| {
            c.query_async(json!({"sql": format!("SELECT pg_sleep(3)::text AS s, {i} AS i")}))
        })))
    });
    // Once the slow ones hold the worker's three sessions (Postgres says so).
    let mut admin = stack.pg.client();
    let started = Instant::now();
    loop {
        let running: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'ferry-sidecar' AND query LIKE '%pg_sleep(3)%'",
                &[],
            )
            .expect("activity")
            .get(0);
        if running == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the slow reads never ran ({running} of 3)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let fast = stack
        .client
        .query(json!({"sql": "SELECT 40 + 2 AS answer"}));
    assert_eq!(
        (fast.status, fast.body["rows"][0]["answer"].clone()),
        (200, json!(42)),
        "served beside the slow reads: {}",
        fast.body
    );
    for a in slow.join().expect("slow reads") {
        assert_eq!(a.status, 200, "{}", a.body);
    }
}

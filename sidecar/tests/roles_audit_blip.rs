//! The roles' audit (RELIABILITY.md, "Who can do what") runs at the first probe that reaches
//! Postgres. When Postgres was not reachable at startup, that probe runs later, on the
//! readiness thread, and its verdict is kept: a refusal for unsafe roles is for good.
//!
//! The adversary: a slow Postgres at that moment. The audit's own query cannot be answered in
//! time (a catalog it reads is locked, so the statement timeout cancels it); the roles
//! themselves are kept apart. A sidecar that took "the roles could not be checked" for "the
//! roles are unsafe" answered every read 503 until a restart. Once the catalog is free, reads
//! must be served; Postgres's own rows judge.

use ferry_testkit::{Client, PgServer, RedisServer, Sidecar, SECRET};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn an_audit_that_could_not_be_asked_is_asked_again_not_kept_as_unsafe_roles() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let mut admin = pg.client();
    // Not reachable at startup: the request role may not log in yet.
    admin
        .batch_execute("ALTER ROLE ferry_app NOLOGIN")
        .expect("nologin");
    let mut config = ferry_testkit::sidecar::test_config(&redis, &pg);
    ferry_testkit::sidecar::as_demo_roles(&mut config, &pg);
    config.postgres.statement_timeout_ms = 300;
    let sidecar = Sidecar::start(config);
    let c = Client::new(&sidecar.base_url(), SECRET);
    let read = || {
        c.block_on(c.post(
            "/v1/query",
            &json!({"sql": "SELECT count(*)::int AS n FROM items"}),
        ))
    };
    let refused = read();
    assert_eq!(refused.status, 503, "not reachable yet: {}", refused.body);

    // The catalog the audit reads for role membership is locked; then the role may log in.
    let mut lock = pg.client();
    let mut tx = lock.transaction().expect("begin");
    tx.batch_execute("LOCK TABLE pg_catalog.pg_auth_members IN ACCESS EXCLUSIVE MODE")
        .expect("lock pg_auth_members");
    admin
        .batch_execute("ALTER ROLE ferry_app LOGIN")
        .expect("login");

    // The audit runs into the lock (its statement then cancelled by statement_timeout).
    let started = Instant::now();
    loop {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE usename = 'ferry_app' AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("activity")
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the audit never waited on the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past the statement timeout, and a readiness interval or two after it.
    std::thread::sleep(Duration::from_millis(1_500));
    let during = read();
    assert_eq!(during.status, 503, "not audited yet: {}", during.body);
    tx.rollback().expect("unlock");

    // The catalog is free: the audit is asked again, finds the roles apart, and reads are
    // served from Postgres.
    let started = Instant::now();
    let answered = loop {
        let a = read();
        if a.status == 200 {
            break a;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "reads still refused once the audit could be asked: {} {}",
            a.status,
            a.body
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let n: i32 = admin
        .query_one("SELECT count(*)::int FROM items", &[])
        .expect("count")
        .get(0);
    assert_eq!(answered.body["rows"][0]["n"], json!(n), "{}", answered.body);
}

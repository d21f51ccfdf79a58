//! Ferry's books (the nonce table, its record function, and the request role's grants on them)
//! are made on first use by whichever maker gets there first: a sidecar's nonce sweeper, a
//! request's first write, another sidecar. Makers race.
//!
//! The adversary: another maker replaces the record function (`CREATE OR REPLACE`, as another
//! sidecar would) while this sidecar grants the request role. Postgres then fails this
//! sidecar's GRANT ("tuple concurrently updated") and rolls it back whole. A sidecar that
//! shrugged that off and marked its books ready could never write again: every write's record
//! call fails with "permission denied for schema ferry" (seen in CI, a request racing its own
//! sidecar's sweeper). Every write after the race must commit; Postgres's rows judge.

use ferry_testkit::{Client, PgServer, RedisServer, Sidecar, SECRET};
use serde_json::json;
use std::time::{Duration, Instant};

const FUNCTION: &str = "ferry.ferry_record_write(bytea, integer, bigint, bytea, boolean)";

#[test]
fn a_grant_beaten_by_another_makers_replace_is_made_again_before_any_write() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let mut admin = pg.client();
    admin
        .batch_execute(
            "CREATE TABLE first_writes (n serial PRIMARY KEY, who text NOT NULL);
             GRANT INSERT ON first_writes TO ferry_app;
             GRANT USAGE ON SEQUENCE first_writes_n_seq TO ferry_app;",
        )
        .expect("table");
    let config = || {
        let mut c = ferry_testkit::sidecar::test_config(&redis, &pg);
        ferry_testkit::sidecar::as_demo_roles(&mut c, &pg);
        c
    };
    let write = |c: &Client, who: &str| {
        let body = json!({"sql": "INSERT INTO first_writes (who) VALUES ($1)", "params": [who]});
        c.block_on(c.post("/v1/execute", &body))
    };

    // A first sidecar makes the books; then the request role's grants are taken back, so the
    // next sidecar has them to make again.
    {
        let first = Sidecar::start(config());
        let c = Client::new(&first.base_url(), SECRET);
        let a = write(&c, "first");
        assert_eq!(a.status, 200, "{}", a.body);
    }
    admin
        .batch_execute(&format!(
            "REVOKE USAGE ON SCHEMA ferry FROM ferry_app; \
             REVOKE EXECUTE ON FUNCTION {FUNCTION} FROM ferry_app"
        ))
        .expect("revoke");

    // Another maker replaces the function (its own definition, unchanged) and holds it there.
    let definition: String = admin
        .query_one(
            &format!("SELECT pg_get_functiondef('{FUNCTION}'::regprocedure)"),
            &[],
        )
        .expect("definition")
        .get(0);
    let mut other = admin.transaction().expect("begin");
    other.batch_execute(&definition).expect("replace");

    // The second sidecar's maker grants, and waits on that replace; the replace commits.
    let second = Sidecar::start(config());
    let mut probe = pg.client();
    let started = Instant::now();
    while !owner_waits(&mut probe) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the second sidecar never came to grant"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    other.commit().expect("commit the replace");

    let c = Client::new(&second.base_url(), SECRET);
    let answers: Vec<(u16, String)> = (0..4)
        .map(|i| {
            let a = write(&c, &format!("after {i}"));
            (a.status, a.body.to_string())
        })
        .collect();
    assert!(
        answers.iter().all(|(s, _)| *s == 200),
        "every write after the race commits: {answers:?}"
    );
    let rows: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM first_writes", &[])
        .expect("count")
        .get(0);
    assert_eq!(rows, 5);
    let granted: bool = pg
        .client()
        .query_one(
            &format!(
                "SELECT has_schema_privilege('ferry_app', 'ferry', 'USAGE') \
                   AND has_function_privilege('ferry_app', '{FUNCTION}', 'EXECUTE')"
            ),
            &[],
        )
        .expect("privileges")
        .get(0);
    assert!(granted, "the request role holds what its writes need");
}

/// Whether a session of Ferry's role waits on a lock (the replace's, held by this test).
fn owner_waits(probe: &mut postgres::Client) -> bool {
    probe
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE NOT l.granted AND a.usename = 'ferry_owner')",
            &[],
        )
        .expect("pg_locks")
        .get(0)
}

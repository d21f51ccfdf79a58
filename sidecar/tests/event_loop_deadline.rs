//! A slow or hostile read on a worker's event-loop Postgres session (`store/statements/on_loop.rs`) meets
//! the request deadline. The caller gets its 504 at the deadline, not when Postgres is done; the
//! session's own task still ends the statement and resets the session, so what the read changed
//! never reaches a later request. On the binary: one worker, a Postgres pool of two (one
//! event-loop session, one pooled connection), a 1 s request deadline under a 10 s statement
//! timeout. Postgres's own view judges.
use ferry_testkit::{wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn a_read_past_the_deadline_answers_at_the_deadline_and_leaves_nothing_behind() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_SERVER_WORKERS", "1"),
            ("FERRY_POSTGRES_POOL_SIZE", "2"),
            ("FERRY_SERVER_REQUEST_TIMEOUT_MS", "1000"),
            ("FERRY_POSTGRES_STATEMENT_TIMEOUT_MS", "10000"),
            ("FERRY_AUTH_ALLOW_RAW_SQL", "true"),
        ],
        Stdio::null(),
    );
    let c = &s.client;
    let settings = || {
        let a = c.query(json!({"sql":
            "SELECT current_setting('statement_timeout') AS timeout,
                    current_setting('search_path') AS search_path,
                    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')::int AS locks"}));
        assert_eq!(a.status, 200, "{:?}", a.body);
        a.body["rows"][0].clone()
    };
    // Warm: the event-loop session exists and is idle.
    assert_eq!(settings()["timeout"], "10s");

    // Changes its session, takes a lock, then outlasts the deadline by far.
    let start = Instant::now();
    let slow = c.query(json!({"sql":
        "SELECT set_config('statement_timeout', '0', false) AS a,
                set_config('search_path', 'pg_temp, public', false) AS b,
                pg_advisory_lock(7)::text AS c, pg_sleep(3)::text AS d"}));
    let took = start.elapsed();
    assert_eq!(slow.status, 504, "{:?}", slow.body);
    assert_eq!(slow.code(), "timeout", "{:?}", slow.body);
    assert!(
        took < Duration::from_millis(2500),
        "answered at the deadline, not when Postgres finished: {took:?}"
    );

    // Reads meanwhile are served (by the pooled connection) and see nothing of it.
    let meanwhile = settings();
    assert_eq!(meanwhile["timeout"], "10s", "{meanwhile}");
    assert_eq!(meanwhile["search_path"], "\"$user\", public", "{meanwhile}");

    // Once the statement ends, its task resets the session: Postgres shows every sidecar
    // backend idle, outside a transaction, and no advisory lock left.
    wait_until("the slow statement to end", Duration::from_secs(10), || {
        let row = pg
            .client()
            .query_one(
                "SELECT count(*) FILTER (WHERE state <> 'idle' OR xact_start IS NOT NULL),
                        (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')
                 FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'",
                &[],
            )
            .expect("pg_stat_activity");
        row.get::<_, i64>(0) == 0 && row.get::<_, i64>(1) == 0
    });
    // Every later read, on whichever connection, is fresh (several, so the event-loop session
    // that ran the slow read serves some of them).
    for _ in 0..5 {
        let after = settings();
        assert_eq!(after["timeout"], "10s", "{after}");
        assert_eq!(after["search_path"], "\"$user\", public", "{after}");
        assert_eq!(after["locks"], 0, "{after}");
    }
    assert_eq!(pg.sidecar_backends(), 2, "no connection leaked or lost");
}

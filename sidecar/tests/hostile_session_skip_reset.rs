//! `skip_reset = true` on a named query (the operator's opt-in that spares Postgres the session
//! reset after each successful run of that one statement) against the hostile caller holding
//! the secret, raw SQL switched on. Whatever a raw read, an end user's identity or a failed run
//! leaves on a session must still be reset before the session serves anyone else: on the
//! pooled path (a pool of one connection) and on the event loop (one worker, one event-loop
//! session). The opted-in statement reads its own session (`current_setting`, `current_user`,
//! its advisory locks), and Postgres's `pg_stat_activity` and `pg_locks` judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

const CONFIG: &str = r#"
[identity]
roles = ["authenticated"]
claims_setting = "request.jwt.claims"
rate_per_s = 0

# What the session looks like to the next statement: reads nothing but the session.
[queries.peek]
sql = """SELECT current_setting('application_name') AS app,
                current_setting('search_path') AS path,
                current_user::text AS who,
                coalesce(current_setting('request.jwt.claims', true), '') AS claims,
                (SELECT count(*) FROM pg_locks
                  WHERE locktype = 'advisory' AND pid = pg_backend_pid())::int AS locks"""
skip_reset = true

# A careless operator's statement: takes a session lock, then fails when $1 is 0 (the
# volatile random() keeps Postgres from folding the division, and failing, before the lock).
[queries.careless]
sql = "SELECT pg_advisory_lock(77) IS NULL AS locked, 1 / ($1::int + floor(random())::int) AS q"
skip_reset = true

# A careless statement whose fast run (one round trip, remembered parameter types, an unnamed
# statement) takes a session lock and fails with a class-22 error, which reads as stale
# remembered types: the sidecar runs it again the slow way (a named prepared statement, seen in
# pg_prepared_statements), where it succeeds. The failed attempt is a failed run too. (On the
# pooled path. On the event loop the statement stays prepared between requests, so it never
# fails here; skip_reset_prepared.rs makes the same attack on a prepared statement.)
[queries.flaky]
sql = """SELECT CASE WHEN (SELECT count(*) FROM pg_prepared_statements) = 0
                     THEN (pg_advisory_lock(78) IS NULL)::int / 0 ELSE 1 END AS q"""
skip_reset = true
"#;

struct Target {
    _redis: RedisServer,
    pg: PgServer,
    sidecar: SidecarProcess,
    _dir: tempfile::TempDir,
}

fn start(shape: &[(&str, &str)]) -> Target {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ferry.toml");
    std::fs::write(&file, CONFIG).expect("write config");
    let env = [
        shape,
        &[
            ("FERRY_CONFIG", file.to_str().expect("utf-8")),
            ("FERRY_POSTGRES_MIN_IDLE", "1"),
            ("FERRY_AUTH_ALLOW_RAW_SQL", "true"),
            // The readiness ping (SELECT 1 on a pooled session) would run between a read and
            // the judge's look at what its session ran last.
            ("FERRY_SERVER_READINESS_INTERVAL_MS", "3600000"),
        ],
    ]
    .concat();
    let sidecar = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    Target {
        _redis: redis,
        pg,
        sidecar,
        _dir: dir,
    }
}

/// Every request on one pooled session.
fn pooled() -> Target {
    start(&[("FERRY_POSTGRES_POOL_SIZE", "1")])
}

/// One worker, a pool of two: its one event-loop session serves every read.
fn event_loop() -> Target {
    start(&[
        ("FERRY_SERVER_WORKERS", "1"),
        ("FERRY_POSTGRES_POOL_SIZE", "2"),
    ])
}

impl Target {
    fn read(&self, body: Value) -> Value {
        let a = self.sidecar.client.query(body.clone());
        assert_eq!(a.status, 200, "{body} -> {:?}", a.body);
        a.body["rows"][0].clone()
    }

    /// The opted-in statement's view of its session, which must be a fresh one's.
    fn peek_is_fresh(&self, after: &str) {
        for _ in 0..4 {
            let row = self.read(json!({"query": "peek"}));
            assert_eq!(row["app"], "ferry-sidecar", "after {after}: {row}");
            assert_eq!(row["path"], "\"$user\", public", "after {after}: {row}");
            assert_eq!(row["who"], "postgres", "after {after}: {row}");
            assert_eq!(row["claims"], "", "after {after}: {row}");
            assert_eq!(row["locks"], 0, "after {after}: {row}");
        }
        // Postgres's view: no session of the sidecar's (over TCP; the judge's own come over the
        // unix socket, and one just closed may still be on its way out) holds a lock or a
        // changed name.
        let c = &mut self.pg.client();
        let odd: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
                   AND client_addr IS NOT NULL AND application_name <> 'ferry-sidecar'",
                &[],
            )
            .expect("pg_stat_activity")
            .get(0);
        assert_eq!(odd, 0, "after {after}: a backend was renamed");
        let locks: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
                &[],
            )
            .expect("pg_locks")
            .get(0);
        assert_eq!(locks, 0, "after {after}: an advisory lock is held");
    }

    /// The statement each of the sidecar's backends ran last, as Postgres reports it.
    fn last_statements(&self) -> Vec<String> {
        self.pg
            .client()
            .query(
                "SELECT query FROM pg_stat_activity WHERE backend_type = 'client backend'
                   AND pid <> pg_backend_pid() AND datname = current_database()
                   AND state = 'idle' ORDER BY pid",
                &[],
            )
            .expect("pg_stat_activity")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Postgres's view of the opt-in working: a raw read's session runs `DISCARD ALL` after
    /// it, the opted-in statement stays the last its session ran (read twice, 50 ms apart, so
    /// a reset still on its way is seen).
    fn only_the_opted_in_statement_skips_the_reset(&self) {
        self.read(json!({"sql": "SELECT 1 AS raw"}));
        ferry_testkit::wait_until("the raw read's reset", Duration::from_secs(5), || {
            let last = self.last_statements();
            last.iter().all(|q| !q.contains("AS raw")) && last.iter().any(|q| q == "DISCARD ALL")
        });
        // Twice: the first run of a statement prepares it (a path of its own); the second runs
        // it the fast way, in one round trip.
        for _ in 0..2 {
            self.read(json!({"query": "peek"}));
        }
        let peek = |last: &[String]| last.iter().any(|q| q.contains("AS claims"));
        ferry_testkit::wait_until("the opted-in read, last", Duration::from_secs(5), || {
            let before = self.last_statements();
            std::thread::sleep(Duration::from_millis(50));
            peek(&before) && self.last_statements() == before
        });
    }

    fn attack(&self) {
        self.only_the_opted_in_statement_skips_the_reset();
        self.peek_is_fresh("nothing");
        for sql in [
            "SELECT set_config('application_name', 'poisoned', false) AS x",
            "SELECT set_config('search_path', 'pg_catalog', false) AS x",
            "SELECT pg_advisory_lock(42) IS NULL AS x",
        ] {
            self.read(json!({ "sql": sql }));
            self.peek_is_fresh(sql);
        }
        // An end user's run of the opted-in statement itself: the role and the claims go.
        let as_user = self.read(json!({
            "query": "peek",
            "identity": {"role": "authenticated", "claims": {"sub": "mallory"}}
        }));
        assert_eq!(as_user["who"], "authenticated", "{as_user}");
        self.peek_is_fresh("a read as an end user");
        // A failed run is reset whatever its statement promised: the lock it took goes (each
        // path: the first run prepares the statement, the next runs it the fast way).
        for _ in 0..2 {
            let failed = self
                .sidecar
                .client
                .query(json!({"query": "careless", "params": [0]}));
            assert_eq!(failed.status, 400, "{:?}", failed.body);
            self.peek_is_fresh("a failed run");
        }
        // A run that failed once, took the slow way and succeeded: its failed attempt's lock
        // goes too (the first run prepares; each later one fails fast, then succeeds).
        for _ in 0..3 {
            assert_eq!(self.read(json!({"query": "flaky"}))["q"], 1);
            self.peek_is_fresh("a run that failed, then succeeded the slow way");
        }
    }
}

#[test]
fn on_a_pooled_session_nothing_reaches_the_statement_that_skips_the_reset() {
    pooled().attack();
}

#[test]
fn on_the_event_loop_nothing_reaches_the_statement_that_skips_the_reset() {
    event_loop().attack();
}

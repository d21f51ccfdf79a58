//! `skip_reset` statements stay prepared on their session between requests (Bind and Execute
//! only, no parse or plan), and nothing else ever finds them there: on a worker's event-loop
//! session and on a pooled one. One worker, one session that serves every read, raw SQL and
//! `/sql` switched on (the hostile caller
//! holding the secret, or the Neon token). Postgres's own `pg_prepared_statements`, read by the statements themselves,
//! judges; a schema change under a prepared statement must not fail the read.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const NEON_TOKEN: &str = "neon-prepared-token-0123456789abcdef0123456";

const CONFIG: &str = r#"
[identity]
roles = ["authenticated"]
claims_setting = "request.jwt.claims"
rate_per_s = 0

# What this session holds prepared from earlier requests, as the opted-in statement sees it
# (a statement's first run prepares it in its own request: too recent to count; the test waits
# 400 ms before it looks).
[queries.held]
sql = """SELECT count(*)::int AS n FROM pg_prepared_statements
          WHERE statement_timestamp() - prepare_time > interval '200 ms'"""
skip_reset = true

# A careless statement that fails (class 22, read as a stale statement) after taking a session
# lock when it runs as a statement prepared by an earlier request, and succeeds when freshly
# prepared: the sidecar resets the session before preparing it again, so the lock goes.
[queries.flaky]
sql = """SELECT CASE WHEN (SELECT min(statement_timestamp() - prepare_time) FROM pg_prepared_statements)
                          > interval '200 ms'
                     THEN (pg_advisory_lock(79) IS NULL)::int / 0 ELSE 1 END AS q"""
skip_reset = true

# Every column of a table whose shape the test changes under the prepared statement.
[queries.shape]
sql = "SELECT * FROM prep_shape WHERE id = $1"
skip_reset = true
"#;

fn read(sidecar: &SidecarProcess, body: Value) -> Value {
    let a = sidecar.client.query(body.clone());
    assert_eq!(a.status, 200, "{body} -> {:?}", a.body);
    a.body["rows"][0].clone()
}

/// A `/sql` read as Neon's driver sends it, its text output parsed.
fn neon_sql(sidecar: &SidecarProcess, sql: &str) -> Value {
    let url = format!("http://127.0.0.1:{}/sql", sidecar.port);
    let conn = format!("postgresql://app:{NEON_TOKEN}@db.ferry.invalid/app");
    let body = json!({"query": sql, "params": []}).to_string();
    sidecar.client.block_on(async move {
        let r = reqwest::Client::new()
            .post(url)
            .header("Neon-Connection-String", conn)
            .body(body)
            .send()
            .await
            .expect("/sql");
        assert_eq!(r.status(), 200);
        r.json().await.expect("/sql json")
    })
}

#[test]
fn skip_reset_statements_stay_prepared_and_nothing_else_sees_them() {
    // One event-loop session (3/4 of a pool of 2) serves every read; `/sql` uses it too.
    scenario("2", true);
}

#[test]
fn on_the_pooled_path_too() {
    // A pool of 1: no event-loop session at all, every read on the one pooled session.
    scenario("1", false);
}

fn scenario(pool_size: &str, neon: bool) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema(); // the `authenticated` role
    pg.client()
        .batch_execute(
            "CREATE TABLE prep_shape (id int PRIMARY KEY); INSERT INTO prep_shape VALUES (1)",
        )
        .expect("table");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ferry.toml");
    std::fs::write(&file, CONFIG).expect("write config");
    let env = [
        ("FERRY_CONFIG", file.to_str().expect("utf-8")),
        ("FERRY_AUTH_ALLOW_RAW_SQL", "true"),
        ("FERRY_SERVER_WORKERS", "1"),
        ("FERRY_POSTGRES_POOL_SIZE", pool_size),
        ("FERRY_SERVER_READINESS_INTERVAL_MS", "3600000"),
        ("FERRY_NEON_ENABLED", if neon { "true" } else { "false" }),
        ("FERRY_NEON_TOKEN", NEON_TOKEN),
    ];
    let sidecar = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());

    let pause = || std::thread::sleep(std::time::Duration::from_millis(400));
    let held = || read(&sidecar, json!({"query": "held"}))["n"].clone();
    let shape = || read(&sidecar, json!({"query": "shape", "params": [1]}));
    // The first run prepares the statement; later ones find it still there, requests later
    // (with an unnamed statement each time, Postgres would hold none).
    held();
    pause();
    for _ in 0..2 {
        assert_eq!(held(), 1, "the opted-in statement is not kept prepared");
    }
    assert_eq!(shape()["id"], 1);
    pause();
    assert_eq!(held(), 2);

    // Anything else on that session finds none of them: raw SQL, and the opted-in statement
    // itself run as an end user (which always resets after it).
    let raw = json!({"sql": "SELECT coalesce(string_agg(statement, ' | '), '') AS s FROM pg_prepared_statements"});
    let leaked = |row: Value| {
        let s = row["s"].as_str().unwrap_or_default().to_string();
        s.contains("AS n FROM") || s.contains("prep_shape")
    };
    assert!(!leaked(read(&sidecar, raw.clone())), "raw SQL saw them");
    held();
    shape();
    pause();
    let as_user = read(
        &sidecar,
        json!({"query": "held", "identity": {"role": "authenticated", "claims": {"sub": "m"}}}),
    );
    assert_eq!(
        as_user["n"], 0,
        "an end user's run found statements prepared before it"
    );
    held();
    shape();
    assert!(!leaked(read(&sidecar, raw.clone())), "raw SQL saw them");
    // The same through `/sql` (the Neon protocol), which runs on the worker's session too.
    if neon {
        held();
        shape();
        let neon = neon_sql(&sidecar, raw["sql"].as_str().unwrap_or_default());
        assert!(!leaked(neon["rows"][0].clone()), "/sql saw them: {neon}");
    }

    // A run that failed as the prepared statement and succeeded prepared again: the lock its
    // failed attempt took is gone (Postgres's pg_locks judges).
    let locks = || -> i64 {
        pg.client()
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
                &[],
            )
            .expect("pg_locks")
            .get(0)
    };
    for _ in 0..3 {
        assert_eq!(read(&sidecar, json!({"query": "flaky"}))["q"], 1);
        assert_eq!(locks(), 0, "a failed attempt's lock outlived it");
        std::thread::sleep(std::time::Duration::from_millis(400));
    }

    // The table changes shape under the prepared statement (Postgres refuses to run a cached
    // plan whose result type changed): the read is answered, with the new column.
    for _ in 0..2 {
        read(&sidecar, json!({"query": "shape", "params": [1]}));
    }
    pg.client()
        .batch_execute("ALTER TABLE prep_shape ADD COLUMN label text DEFAULT 'new'")
        .expect("alter");
    for _ in 0..2 {
        let row = read(&sidecar, json!({"query": "shape", "params": [1]}));
        assert_eq!(row["label"], "new", "{row}");
    }
}

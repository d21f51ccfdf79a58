//! The Neon-compatible `/sql` endpoint, driven by the real clients, unchanged: npm
//! `@neondatabase/serverless` and Drizzle's `neon-http` (installed by scripts/test.sh into
//! FERRY_CLIENTS_DIR), against the binary and a private Postgres. Then the adversaries, over
//! plain HTTP, with Postgres's own view (the rows, `pg_locks`, `pg_stat_activity`) as judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "neon-rw-token-0123456789abcdef0123456789";
const RO_TOKEN: &str = "neon-ro-token-0123456789abcdef0123456789";

fn start() -> (RedisServer, PgServer, SidecarProcess, tempfile::TempDir) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.client()
        .batch_execute(
            "CREATE TABLE neon_items (id serial PRIMARY KEY, name text UNIQUE NOT NULL, \
             qty int NOT NULL);
             CREATE TABLE victims (id int);",
        )
        .expect("schema");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("ferry.toml");
    std::fs::write(
        &config,
        format!(
            "[postgres]\npool_size = 8\n[neon]\nenabled = true\n\
             [[neon.tokens]]\ntoken = \"{TOKEN}\"\n\
             [[neon.tokens]]\ntoken = \"{RO_TOKEN}\"\nread_only = true\n"
        ),
    )
    .expect("config");
    let config = config.display().to_string();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_CONFIG", config.as_str()),
            ("FERRY_LIMITS_MAX_READ_BYTES", "1000000"),
        ],
        Stdio::null(),
    );
    (redis, pg, s, dir)
}

/// POST /sql with the driver's headers (and `extra`), over plain HTTP.
fn post(s: &SidecarProcess, token: &str, body: Value, extra: &[(&str, &str)]) -> (u16, Value) {
    let (status, _, body) = post_full(s, token, body, extra);
    (status, body)
}

/// The same, with the answer's headers.
fn post_full(
    s: &SidecarProcess,
    token: &str,
    body: Value,
    extra: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{token}@db.ferry.invalid/app");
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    s.client.block_on(async move {
        let mut r = reqwest::Client::new()
            .post(url)
            .header("Neon-Connection-String", conn)
            .header("Neon-Raw-Text-Output", "true")
            .header("Neon-Array-Mode", "true")
            .body(body.to_string());
        for (k, v) in extra {
            r = r.header(k, v);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
}

#[test]
fn the_real_neon_driver_and_drizzle_work_unchanged() {
    let (_redis, pg, s, _dir) = start();
    let url = format!("http://127.0.0.1:{}", s.port);
    ferry_testkit::clients::run_node(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/neon.mjs"
        )),
        &[
            ("URL", url.as_str()),
            ("TOKEN", TOKEN),
            ("RO_TOKEN", RO_TOKEN),
        ],
        30,
    );

    // Postgres's view: the rows the clients committed, and nothing of the failed transaction.
    let names: Vec<String> = pg
        .client()
        .query("SELECT name FROM neon_items ORDER BY name", &[])
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(names, ["a", "b", "c", "drizzle"]);
    assert!(pg.sidecar_backends() <= 8, "more sessions than the pool");
}

/// A hostile caller holding a token tries to make a parameter run as SQL (turning off
/// standard_conforming_strings, then a value full of quotes and backslashes), to leave state
/// on a pooled session for the next caller, to write with a read-only token, and to exhaust
/// the sidecar's memory.
#[test]
fn a_hostile_caller_cannot_escape_its_statement_or_its_session() {
    let (_redis, pg, s, _dir) = start();
    let hostile = "\\'); DROP TABLE victims; --\u{e9}'\\";
    // Standard strings off (backslash escapes a quote), then also a client encoding whose
    // multibyte characters can swallow a quote.
    for encoding in ["UTF8", "SJIS"] {
        let (status, body) = post(
            &s,
            TOKEN,
            json!({"queries": [
                {"query": "SELECT set_config('standard_conforming_strings', 'off', true)", "params": []},
                {"query": "SELECT set_config('client_encoding', $1, true)", "params": [encoding]},
                {"query": "INSERT INTO neon_items (name, qty) VALUES ($1, 1)", "params": [format!("{hostile}{encoding}")]},
            ]}),
            &[],
        );
        assert_eq!(status, 200, "{encoding}: {body}");
    }
    let mut c = pg.client();
    let victims: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'victims'",
            &[],
        )
        .expect("catalog")
        .get(0);
    assert_eq!(victims, 1, "the value ran as SQL");
    let stored: Vec<String> = c
        .query("SELECT name FROM neon_items ORDER BY name", &[])
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        stored,
        [format!("{hostile}SJIS"), format!("{hostile}UTF8")],
        "the value was stored exactly"
    );

    // Session state, locks and settings left behind by one request never reach the next.
    let (status, body) = post(
        &s,
        TOKEN,
        json!({"query": "SELECT set_config('search_path', 'nowhere', false), pg_advisory_lock(4242)"}),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    for _ in 0..16 {
        let (_, body) = post(
            &s,
            TOKEN,
            json!({"query": "SELECT current_setting('search_path') AS p"}),
            &[],
        );
        assert_eq!(
            body["rows"],
            json!([["\"$user\", public"]]),
            "a session kept another's setting"
        );
    }
    let locks: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
            &[],
        )
        .expect("locks")
        .get(0);
    assert_eq!(locks, 0, "an advisory lock outlived its request");

    // A read-only token cannot write, even after turning the session default off.
    let (status, body) = post(
        &s,
        RO_TOKEN,
        json!({"queries": [
            {"query": "SELECT set_config('default_transaction_read_only', 'off', false)"},
            {"query": "INSERT INTO victims VALUES (1)"},
        ]}),
        &[],
    );
    assert_eq!(
        (status, body["code"].clone()),
        (400, json!("25006")),
        "{body}"
    );
    let (status, body) = post(
        &s,
        RO_TOKEN,
        json!({"query": "INSERT INTO victims VALUES (2)"}),
        &[],
    );
    assert_eq!(
        (status, body["code"].clone()),
        (400, json!("25006")),
        "{body}"
    );
    let written: i64 = c
        .query_one("SELECT count(*) FROM victims", &[])
        .expect("victims")
        .get(0);
    assert_eq!(written, 0, "a read-only token wrote");

    // A result far larger than the read limit is cut off, not buffered.
    let (status, body) = post(
        &s,
        TOKEN,
        json!({"query": "SELECT repeat('x', 1000000) FROM generate_series(1, 2000)"}),
        &[],
    );
    assert_eq!(
        (status, body["code"].clone()),
        (422, json!("result_too_large")),
        "{body}"
    );
    let rss_kb = ferry_testkit::peak_rss_kb(s.pid());
    println!("peak RSS after a 2 GB result: {rss_kb} kB");
    assert!(
        rss_kb < 64_000,
        "peak RSS {rss_kb} kB: the result was buffered"
    );

    // Bad input: each refusal is a clear JSON error with a stable code.
    let (status, body) = post(&s, TOKEN, json!({"sql": "SELECT 1"}), &[]);
    assert_eq!(
        (status, body["code"].clone()),
        (400, json!("bad_request")),
        "{body}"
    );
    let (status, body) = post(
        &s,
        "x".repeat(40).as_str(),
        json!({"query": "SELECT 1"}),
        &[],
    );
    assert_eq!(
        (status, body["code"].clone()),
        (401, json!("unauthorized")),
        "{body}"
    );
    let (status, body) = post(
        &s,
        TOKEN,
        json!({"queries": [{"query": "SELECT 1"}]}),
        &[("Neon-Batch-Isolation-Level", "Chaos")],
    );
    assert_eq!(
        (status, body["message"].clone()),
        (400, json!("invalid isolation level")),
        "{body}"
    );
    let (status, body) = post(
        &s,
        TOKEN,
        json!({"query": "SELECT $1::text", "params": ["a\u{0}b"]}),
        &[],
    );
    assert_eq!(
        (status, body["code"].clone()),
        (400, json!("22021")),
        "{body}"
    );
    let (status, body) = post(
        &s,
        TOKEN,
        json!({"query": "SELECT 1; DROP TABLE victims"}),
        &[],
    );
    assert_eq!(
        (status, body["code"].clone()),
        (400, json!("42601")),
        "{body}"
    );
    assert!(pg.sidecar_backends() <= 8, "more sessions than the pool");
    let still: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'victims'",
            &[],
        )
        .expect("catalog")
        .get(0);
    assert_eq!(still, 1);
}

/// Postgres stopped under `/sql`: a fast 503 with Retry-After in the driver's error shape,
/// nothing internal in it, and answers again once Postgres is back, without a restart.
#[test]
fn postgres_stopped_answers_fast_and_recovers() {
    let (_redis, mut pg, s, _dir) = start();
    let read = json!({"query": "SELECT count(*) AS n FROM neon_items"});
    assert_eq!(post(&s, TOKEN, read.clone(), &[]).0, 200);
    pg.stop();
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{TOKEN}@db.ferry.invalid/app");
    let (status, retry_after, body) = s.client.block_on(async {
        let r = reqwest::Client::new()
            .post(url)
            .header("Neon-Connection-String", conn)
            .body(read.to_string())
            .send()
            .await
            .expect("send");
        let retry = r.headers().contains_key("retry-after");
        (r.status().as_u16(), retry, r.text().await.expect("body"))
    });
    assert_eq!(status, 503, "{body}");
    assert!(retry_after, "no Retry-After");
    assert!(body.contains("database_unavailable"), "{body}");
    assert!(
        !body.contains("127.0.0.1") && !body.contains("Connection refused"),
        "{body}"
    );
    pg.start_again();
    ferry_testkit::wait_until(
        "/sql to answer again",
        std::time::Duration::from_secs(15),
        || post(&s, TOKEN, read.clone(), &[]).0 == 200,
    );
}

/// A Postgres that stops answering (every process SIGSTOPped) under `/sql`: concurrent
/// requests answer with a JSON error near the request deadline instead of hanging, requests
/// keep being answered after SIGCONT without a restart, and Postgres never holds more Ferry
/// sessions than the pool.
#[test]
fn a_frozen_postgres_gets_fast_answers_and_recovery() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_NEON_ENABLED", "true"),
            ("FERRY_NEON_TOKEN", TOKEN),
            ("FERRY_POSTGRES_POOL_SIZE", "4"),
            ("FERRY_SERVER_REQUEST_TIMEOUT_MS", "1000"),
            ("FERRY_POSTGRES_CHECKOUT_TIMEOUT_MS", "500"),
        ],
        Stdio::null(),
    );
    let read = |n: i32| json!({"query": "SELECT $1::int + 1 AS n", "params": [n.to_string()]});
    for n in 0..8 {
        assert_eq!(post(&s, TOKEN, read(n), &[]).0, 200);
    }
    let pids = pg.freeze();
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{TOKEN}@db.ferry.invalid/app");
    let answers = s.client.block_on(async {
        // A bound of its own, so a sidecar that hangs fails the test instead of stalling it.
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .expect("client");
        let reads = (0..12).map(|n| {
            let (http, url, conn, body) = (http.clone(), url.clone(), conn.clone(), read(n));
            async move {
                let t = std::time::Instant::now();
                let sent = http
                    .post(url)
                    .header("Neon-Connection-String", conn)
                    .body(body.to_string())
                    .send()
                    .await;
                let (status, body) = match sent {
                    Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
                    Err(e) => (0, Value::String(format!("no answer: {e}"))),
                };
                (status, body, t.elapsed())
            }
        });
        futures::future::join_all(reads).await
    });
    pg.thaw(&pids);
    let slowest = answers.iter().map(|(_, _, t)| *t).max().unwrap_or_default();
    for (status, body, _) in &answers {
        assert!(matches!(status, 503 | 504), "{status}: {body}");
        assert!(
            body["code"].is_string() && body["message"].is_string(),
            "{body}"
        );
    }
    println!("12 /sql reads against a frozen Postgres answered within {slowest:?} (deadline 1 s)");
    assert!(
        slowest < std::time::Duration::from_millis(2500),
        "an answer took {slowest:?} with a 1 s deadline"
    );
    ferry_testkit::wait_until(
        "/sql to recover",
        std::time::Duration::from_secs(20),
        || (0..6).all(|n| post(&s, TOKEN, read(n), &[]).0 == 200),
    );
    let backends = pg.sidecar_backends();
    assert!(backends <= 4, "{backends} Ferry sessions for a pool of 4");
}

/// What Neon's proxy answers, field for field: the command as the first word of Postgres's tag
/// (`CREATE`, not `CREATE TABLE`; `SELECT` with its count for `CREATE TABLE ... AS`), every
/// isolation level run as asked and echoed in the answer's headers, and its words for a bad
/// isolation header.
#[test]
fn answers_are_shaped_as_neons() {
    let (_redis, _pg, s, _dir) = start();
    let one = |sql: &str| post(&s, TOKEN, json!({ "query": sql }), &[]);
    let (status, body) = one("CREATE TABLE tagged (a int)");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["command"], "CREATE", "{body}");
    assert_eq!(body["rowCount"], Value::Null, "{body}");
    let (_, body) = one("CREATE TABLE tagged_as AS SELECT g FROM generate_series(1, 3) g");
    assert_eq!(
        (&body["command"], &body["rowCount"]),
        (&json!("SELECT"), &json!(3)),
        "{body}"
    );
    let (_, body) = one("TRUNCATE tagged");
    assert_eq!(body["command"], "TRUNCATE", "{body}");
    for (header, shown) in [
        ("ReadUncommitted", "read uncommitted"),
        ("ReadCommitted", "read committed"),
        ("RepeatableRead", "repeatable read"),
        ("Serializable", "serializable"),
    ] {
        let (status, headers, body) = post_full(
            &s,
            TOKEN,
            json!({ "queries": [{ "query": "SHOW transaction_isolation" }] }),
            &[
                ("Neon-Batch-Isolation-Level", header),
                ("Neon-Batch-Read-Only", "true"),
            ],
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["results"][0]["rows"][0][0], shown, "{body}");
        assert_eq!(
            headers
                .get("neon-batch-isolation-level")
                .map(|v| v.to_str().unwrap()),
            Some(header)
        );
        assert_eq!(
            headers
                .get("neon-batch-read-only")
                .map(|v| v.to_str().unwrap()),
            Some("true")
        );
    }
    let (status, body) = post(
        &s,
        TOKEN,
        json!({ "queries": [{ "query": "SELECT 1" }] }),
        &[("Neon-Batch-Isolation-Level", "Sideways")],
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["message"], "invalid isolation level", "{body}");
}

//! The Neon-compatible `/sql` endpoint, driven by the real clients, unchanged: npm
//! `@neondatabase/serverless` and Drizzle's `neon-http` (installed by scripts/test.sh into
//! FERRY_CLIENTS_DIR), against the binary and a private Postgres. Then the adversaries, over
//! plain HTTP, with Postgres's own view (the rows, `pg_locks`, `pg_stat_activity`) as judge.
mod neon_common;

use neon_common::*;
use serde_json::{json, Value};

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

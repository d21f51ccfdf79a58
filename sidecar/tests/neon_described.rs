//! A `/sql` read met before runs on its remembered description, in one round trip
//! (`store/postgres/described.rs`). Its columns changed under it (added, renamed, dropped by
//! psql) are answered at once, not a second later when the schema's check forgets the
//! description, and values are never told under another column's name. The read's own
//! answer, against what Postgres holds, judges.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "neon-described-token-0123456789abcdef012345";

/// POST /sql as the Neon driver sends it: (status, body).
fn sql(s: &SidecarProcess, query: &str, params: Value) -> (u16, Value) {
    let a = s
        .client
        .neon(TOKEN, json!({"query": query, "params": params}), &[]);
    (a.status, a.body)
}

fn names(body: &Value) -> Vec<String> {
    body["fields"]
        .as_array()
        .expect("fields")
        .iter()
        .map(|f| f["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_read_met_before_sees_its_columns_change_at_once() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let env = [("FERRY_NEON_ENABLED", "true"), ("FERRY_NEON_TOKEN", TOKEN)];
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    let q = "SELECT * FROM items WHERE id = $1";
    let read = || {
        let (status, body) = sql(&s, q, json!(["1"]));
        assert_eq!(status, 200, "{body}");
        body
    };
    let mut expect = names(&read());
    for _ in 0..3 {
        assert_eq!(names(&read()), expect, "a read met before");
    }
    let mut psql = pg.client();
    // Each change, then the read at once (well within the schema check's second).
    for (ddl, change) in [
        (
            "ALTER TABLE items ADD COLUMN extra int NOT NULL DEFAULT 7",
            "add",
        ),
        ("ALTER TABLE items RENAME COLUMN extra TO extra2", "rename"),
        ("ALTER TABLE items DROP COLUMN price", "drop"),
    ] {
        psql.batch_execute(ddl).expect("ddl");
        match change {
            "add" => expect.push("extra".into()),
            "rename" => *expect.last_mut().expect("a column") = "extra2".into(),
            _ => expect.retain(|n| n != "price"),
        }
        let body = read();
        assert_eq!(names(&body), expect, "after {change}: {body}");
        let last = expect.last().expect("a column").clone();
        assert_eq!(body["rows"][0][&last], "7", "after {change}: {body}");
    }
}

/// A write met before whose columns changed under it is run once, never again to describe it:
/// its answer is told by the columns it returned, described after it ran.
#[test]
fn a_write_met_before_runs_once_when_its_columns_change() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let env = [("FERRY_NEON_ENABLED", "true"), ("FERRY_NEON_TOKEN", TOKEN)];
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    let q = "INSERT INTO notes (owner, body) VALUES ('described', $1) RETURNING *";
    let write = |body: &str| {
        let (status, answer) = sql(&s, q, json!([body]));
        assert_eq!(status, 200, "{answer}");
        answer
    };
    write("one");
    write("two");
    pg.client()
        .batch_execute("ALTER TABLE notes ADD COLUMN tag text NOT NULL DEFAULT 'x'")
        .expect("ddl");
    let answer = write("three");
    assert!(names(&answer).contains(&"tag".to_string()), "{answer}");
    assert_eq!(answer["rows"][0]["tag"], "x", "{answer}");
    let per_body: Vec<(String, i64)> = pg
        .client()
        .query(
            "SELECT body, count(*) FROM notes WHERE owner = 'described' GROUP BY body ORDER BY body",
            &[],
        )
        .expect("count")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        per_body,
        [("one".into(), 1), ("three".into(), 1), ("two".into(), 1)],
        "each write committed once"
    );
}

/// What an end user's statement resolves to is never kept for the token's own requests: as
/// the end user's role, a name may find another table (its search path skips schemas it may
/// not use). An end user's `SELECT * FROM things` reads `shared.things`; the token's own, the
/// same text, reads `private.things`, and is told its own columns' types.
#[test]
fn an_end_users_statement_is_not_described_for_the_token() {
    const SECRET: &str = "described-hs256-secret-0123456789abcdef";
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "GRANT authenticated TO ferry_neon;
             CREATE SCHEMA private; CREATE SCHEMA shared;
             CREATE TABLE private.things (id int, price numeric);
             CREATE TABLE shared.things (id text, price bool);
             INSERT INTO private.things VALUES (1, 12.50);
             INSERT INTO shared.things VALUES ('one', true);
             GRANT USAGE ON SCHEMA private, shared TO ferry_neon;
             GRANT USAGE ON SCHEMA shared TO authenticated;
             GRANT SELECT ON private.things, shared.things TO ferry_neon;
             GRANT SELECT ON shared.things TO authenticated;
             ALTER ROLE ferry_neon SET search_path = private, shared;",
        )
        .expect("schemas");
    let file = ferry_testkit::doors::config_file(&format!(
        "[identity]\nroles = [\"authenticated\"]\nallow_raw_sql = true\n\
         jwt_secret = \"{SECRET}\"\n\
         [neon]\nenabled = true\n[[neon.tokens]]\ntoken = \"{TOKEN}\"\npostgres_url = \"{}\"\n",
        pg.url_as("ferry_neon")
    ));
    let path = file.path().to_str().expect("utf-8 path");
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url_as("ferry_app"),
        &[("FERRY_CONFIG", path)],
        Stdio::null(),
    );
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 300;
    let jwt =
        ferry_shared::jwt::sign_hs256(&json!({"sub": "alice", "exp": exp}), SECRET.as_bytes());
    let send = |bearer: Option<&str>| {
        let auth = bearer.map(|b| format!("Bearer {b}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let a = s.client.neon(
            TOKEN,
            json!({"query": "SELECT * FROM things", "params": []}),
            &headers,
        );
        (a.status, a.body)
    };
    let types = |body: &Value| -> Vec<u64> {
        body["fields"]
            .as_array()
            .expect("fields")
            .iter()
            .map(|f| f["dataTypeID"].as_u64().unwrap_or(0))
            .collect()
    };
    for _ in 0..3 {
        let (status, mine) = send(Some(&jwt));
        assert_eq!(status, 200, "{mine}");
        assert_eq!(
            mine["rows"][0]["id"], "one",
            "the end user reads shared.things: {mine}"
        );
        assert_eq!(types(&mine), [25, 16]);
    }
    for _ in 0..3 {
        let (status, own) = send(None);
        assert_eq!(status, 200, "{own}");
        assert_eq!(own["rows"][0]["id"], "1", "{own}");
        assert_eq!(
            types(&own),
            [23, 1700],
            "told as the end user's table: {own}"
        );
    }
}

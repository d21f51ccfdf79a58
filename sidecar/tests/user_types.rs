//! Columns of user-defined types (enums, a domain, an array of enums), read and written again
//! and again on reused sessions. The driver looks a type up with statements it prepares once
//! and keeps; the per-request reset (`DISCARD ALL`) deallocates them behind its back, so a
//! session that had met one type failed every read of the next with `prepared statement "sN"
//! does not exist` (26000), on `/v1` and on `/sql`. Sessions now learn the database's types at
//! connect; a type made later costs the first session to meet it (the read runs again on
//! another). Postgres's own rows judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "user-types-neon-token-0123456789abcdef01234";

/// POST /sql as the Neon driver sends it: (status, body).
fn sql(s: &SidecarProcess, query: &str) -> (u16, Value) {
    let a = s
        .client
        .neon(TOKEN, json!({"query": query, "params": []}), &[]);
    (a.status, a.body)
}

#[test]
fn user_types_are_read_and_written_again_and_again_on_reused_sessions() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "CREATE TYPE mood AS ENUM ('sad', 'happy');
             CREATE TYPE size AS ENUM ('s', 'm', 'l');
             CREATE DOMAIN positive AS int CHECK (VALUE > 0);
             CREATE TABLE things (id int PRIMARY KEY, m mood NOT NULL, z size NOT NULL,
                                  n positive NOT NULL, ms mood[] NOT NULL);
             INSERT INTO things VALUES (1, 'sad', 's', 1, '{sad,happy}');",
        )
        .expect("types");
    let env = [
        ("FERRY_POSTGRES_POOL_SIZE", "4"),
        ("FERRY_NEON_ENABLED", "true"),
        ("FERRY_NEON_TOKEN", TOKEN),
    ];
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    // Each round meets every type after a reset, one column (one lookup) per request.
    let columns = [("m", json!("sad")), ("z", json!("s")), ("n", json!(1))];
    for round in 0..3 {
        for (column, expect) in &columns {
            let q = format!("SELECT {column} FROM things WHERE id = 1");
            let a = s.client.query(json!({"sql": q}));
            assert_eq!(a.status, 200, "round {round}, /v1 {column}: {:?}", a.body);
            assert_eq!(&a.body["rows"][0][column], expect, "{:?}", a.body);
            let (status, body) = sql(&s, &q);
            assert_eq!(status, 200, "round {round}, /sql {column}: {body}");
        }
        let a = s
            .client
            .query(json!({"sql": "SELECT ms FROM things WHERE id = 1"}));
        assert_eq!(
            a.status, 200,
            "round {round}, an array of enums: {:?}",
            a.body
        );
        assert_eq!(a.body["rows"][0]["ms"], json!(["sad", "happy"]));
        let id = 10 + round;
        let w = s.client.execute(json!({
            "sql": "INSERT INTO things VALUES ($1, $2, $3, $4, '{}')",
            "params": [id, "happy", "l", 2],
        }));
        assert_eq!(w.status, 200, "round {round}, a write: {:?}", w.body);
        assert_eq!(w.body["rows_affected"], 1, "{:?}", w.body);
    }
    // A type made after the sessions learnt theirs: the first session to meet it finds its
    // lookup statement gone, and the read runs again on another (a fresh one at worst).
    pg.client()
        .batch_execute(
            "CREATE TYPE color AS ENUM ('red', 'blue');
             ALTER TABLE things ADD COLUMN c color NOT NULL DEFAULT 'red';",
        )
        .expect("a new type");
    for i in 0..10 {
        let a = s
            .client
            .query(json!({"sql": "SELECT c FROM things WHERE id = 1"}));
        assert_eq!(a.status, 200, "read {i} of a new type: {:?}", a.body);
        assert_eq!(a.body["rows"][0]["c"], "red");
    }
    let written: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM things WHERE z = 'l'", &[])
        .expect("count")
        .get(0);
    assert_eq!(written, 3, "each write committed once");
}

//! Trust levels are Postgres roles. A caller holding the secret (raw SQL on `/v1`, as
//! `ferry_app`) or a Neon token (its own role, `ferry_neon`) goes after Ferry's books, the
//! other callers' sessions and the end users' role; and the binary refuses to start with roles
//! that would let them. Postgres's own view judges: the books' rows, `pg_stat_activity`, the
//! outcome Ferry reports.
use ferry_testkit::doors::config_file;
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const RW: &str = "neon-roles-token-0123456789abcdefghijklmn";

fn config(pg: &PgServer) -> tempfile::NamedTempFile {
    config_file(&format!(
        "[neon]\nenabled = true\n\
         [[neon.tokens]]\ntoken = \"{RW}\"\npostgres_url = \"{}\"\n",
        pg.url_as("ferry_neon")
    ))
}

fn start(redis: &RedisServer, pg: &PgServer, file: &tempfile::NamedTempFile) -> SidecarProcess {
    SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url_as("ferry_app"),
        &[("FERRY_CONFIG", file.path().to_str().expect("utf-8 path"))],
        Stdio::null(),
    )
}

/// (rows in the nonce table, rows in the deferred-invalidation table; 0 while it is not made).
fn books(pg: &PgServer) -> (i64, i64) {
    let mut c = pg.client();
    let count = |c: &mut postgres::Client, table: &str| -> i64 {
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .expect("to_regclass")
            .get(0);
        if !exists {
            return 0;
        }
        c.query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .expect("count")
            .get(0)
    };
    (
        count(&mut c, "ferry.nonces"),
        count(&mut c, "ferry.deferred"),
    )
}

#[test]
fn no_caller_can_write_ferrys_books_or_reach_another_callers_sessions() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let file = config(&pg);
    let s = start(&redis, &pg, &file);
    // A write makes sure the books exist (and leaves its own row).
    let w = s
        .client
        .execute(json!({ "sql": "UPDATE items SET name = 'ok' WHERE id = 9" }));
    assert_eq!(w.status, 200, "{}", w.body);
    let before = books(&pg);
    let forged_nonce = "00112233445566778899aabbccddeeff";
    let attacks = [
        format!(
            "INSERT INTO ferry.nonces VALUES (decode('{forged_nonce}', 'hex'), \
             now() + interval '1 hour', 7)"
        ),
        "DELETE FROM ferry.nonces".to_string(),
        "INSERT INTO ferry.deferred (kind, name) VALUES ('e', '')".to_string(),
        format!(
            "SELECT ferry.ferry_record_write(decode('{forged_nonce}', 'hex'), 3600, 7, \
             sha256('guess'::bytea), false)"
        ),
        "CREATE TABLE ferry.mine (i int)".to_string(),
        "SELECT * FROM pg_logical_slot_get_changes('ferry', NULL, NULL)".to_string(),
    ];
    for sql in &attacks {
        let v1 = s.client.execute(json!({ "sql": sql }));
        assert_ne!(v1.status, 200, "/v1 as ferry_app: {sql}: {}", v1.body);
        let neon = s.client.neon(RW, json!({ "query": sql }), &[]);
        assert_ne!(neon.status, 200, "a Neon token: {sql}: {}", neon.body);
    }
    // Each refused /v1 write left its own nonce (so it cannot be replayed); nothing else.
    let after = books(&pg);
    assert_eq!(
        after,
        (before.0 + attacks.len() as i64, before.1),
        "the books changed"
    );
    let forged: i64 = pg
        .client()
        .query_one(
            "SELECT count(*) FROM ferry.nonces WHERE nonce = decode($1, 'hex')",
            &[&forged_nonce],
        )
        .expect("nonces")
        .get(0);
    assert_eq!(forged, 0, "a forged nonce reached the books");
    // The forged nonce's outcome is Ferry's: never committed (and fenced now).
    let outcome = s.client.block_on(
        s.client
            .post("/v1/outcome", &json!({ "nonce": forged_nonce })),
    );
    assert_eq!(outcome.status, 200, "{}", outcome.body);
    assert_eq!(outcome.body["committed"], false, "{}", outcome.body);

    // The token cannot act as an end user, read /v1's statements, or end its sessions.
    let as_user = s
        .client
        .neon(RW, json!({ "query": "SET ROLE authenticated" }), &[]);
    assert_ne!(as_user.status, 200, "{}", as_user.body);
    let as_user = s.client.neon(
        RW,
        json!({ "query": "SELECT set_config('role', 'authenticated', false)" }),
        &[],
    );
    assert_ne!(as_user.status, 200, "{}", as_user.body);
    let slow = {
        let c = s.client.clone();
        std::thread::spawn(move || {
            c.query(json!({ "sql": "SELECT 'secret-param-42' AS s FROM pg_sleep(1.5)" }))
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let seen = s.client.neon(
        RW,
        json!({ "query": "SELECT pid, state, query FROM pg_stat_activity \
                          WHERE usename = 'ferry_app'" }),
        &[],
    );
    assert_eq!(seen.status, 200, "{}", seen.body);
    let rows = seen.body["rows"].as_array().expect("rows").clone();
    assert!(
        !rows.is_empty(),
        "the /v1 sessions are listed: {}",
        seen.body
    );
    assert!(
        !seen.body.to_string().contains("secret-param-42"),
        "the token read another role's statement: {}",
        seen.body
    );
    let pid = rows[0]["pid"].as_str().expect("a pid").to_string();
    let kill = s.client.neon(
        RW,
        json!({ "query": format!("SELECT pg_terminate_backend({pid})") }),
        &[],
    );
    assert_ne!(
        kill.body["rows"][0]["pg_terminate_backend"], "t",
        "the token ended a /v1 session: {}",
        kill.body
    );
    let slow = slow.join().expect("the slow read");
    assert_eq!(slow.status, 200, "{}", slow.body);
}

/// `--check-config` with the demo's roles and one change: the binary refuses, naming the key.
fn refused_with(pg: &PgServer, change: &[(&str, String)], toml: &str, says: &str) {
    let file = config_file(toml);
    let mut cmd = Command::new(BIN);
    cmd.arg("--check-config")
        .env_clear()
        .env("FERRY_CONFIG", file.path())
        .env("FERRY_SECRET", ferry_testkit::SECRET)
        .env("FERRY_DATABASE_URL", pg.url_as("ferry_app"))
        .env("FERRY_POSTGRES_OWNER_URL", pg.url_as("ferry_owner"));
    for (k, v) in change {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run --check-config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if says.is_empty() {
        assert!(out.status.success(), "refused: {text}");
        return;
    }
    assert!(!out.status.success(), "accepted ({says}): {text}");
    assert!(text.contains(says), "expected {says:?} in: {text}");
}

#[test]
fn roles_that_could_reach_ferrys_books_are_refused_at_startup() {
    // Logical: the change stream's case needs it.
    let pg = PgServer::start_logical();
    pg.setup_demo_schema();
    let token = |role: &str, read_only: bool| {
        format!(
            "[identity]\nroles = [\"authenticated\"]\n\
             [neon]\nenabled = true\n[[neon.tokens]]\ntoken = \"{RW}\"\n\
             read_only = {read_only}\npostgres_url = \"{}\"\n",
            pg.url_as(role)
        )
    };
    // The demo's roles pass.
    refused_with(&pg, &[], &token("ferry_neon", false), "");
    refused_with(&pg, &[], &token("ferry_neon_ro", true), "");
    // A token on the requests' role, or on Ferry's own.
    refused_with(
        &pg,
        &[],
        &token("ferry_app", false),
        "its role is also postgres.url's",
    );
    refused_with(
        &pg,
        &[],
        &token("ferry_owner", false),
        "its role is also postgres.owner_url's",
    );
    // The requests' role as Ferry's own, or a superuser.
    refused_with(
        &pg,
        &[("FERRY_POSTGRES_OWNER_URL", pg.url_as("ferry_app"))],
        "",
        "Ferry's own role",
    );
    refused_with(
        &pg,
        &[("FERRY_DATABASE_URL", pg.url())],
        "",
        "is a superuser",
    );
    let mut c = pg.client();
    // A token's role that holds the end users' role.
    c.batch_execute("GRANT authenticated TO ferry_neon")
        .expect("grant");
    refused_with(&pg, &[], &token("ferry_neon", false), "end users' role");
    c.batch_execute("REVOKE authenticated FROM ferry_neon")
        .expect("revoke");
    // A read-only token whose role may write large objects.
    c.batch_execute("GRANT EXECUTE ON FUNCTION lo_from_bytea(oid, bytea) TO ferry_neon_ro")
        .expect("grant");
    refused_with(&pg, &[], &token("ferry_neon_ro", true), "lo_from_bytea");
    c.batch_execute("REVOKE EXECUTE ON FUNCTION lo_from_bytea(oid, bytea) FROM ferry_neon_ro")
        .expect("revoke");
    // A NOINHERIT read-only token role that may SET ROLE to an end users' role which may write
    // large objects: what it may become counts (the token's SQL can SET ROLE).
    c.batch_execute(
        "ALTER ROLE ferry_neon_ro NOINHERIT; GRANT authenticated TO ferry_neon_ro; \
         GRANT EXECUTE ON FUNCTION lo_from_bytea(oid, bytea) TO authenticated",
    )
    .expect("grant");
    let trusted =
        token("ferry_neon_ro", true).replace("[identity]\n", "[identity]\nallow_raw_sql = true\n");
    refused_with(&pg, &[], &trusted, "lo_from_bytea");
    c.batch_execute(
        "REVOKE EXECUTE ON FUNCTION lo_from_bytea(oid, bytea) FROM authenticated; \
         REVOKE authenticated FROM ferry_neon_ro; ALTER ROLE ferry_neon_ro INHERIT",
    )
    .expect("revoke");
    // A read-only token whose role may write WAL messages (everyone's, until demo.sql).
    let emit = "FUNCTION pg_logical_emit_message(boolean, text, text)";
    c.batch_execute(&format!("GRANT EXECUTE ON {emit} TO ferry_neon_ro"))
        .expect("grant");
    refused_with(
        &pg,
        &[],
        &token("ferry_neon_ro", true),
        "pg_logical_emit_message",
    );
    c.batch_execute(&format!("REVOKE EXECUTE ON {emit} FROM ferry_neon_ro"))
        .expect("revoke");
    // With the change stream on, a request role that could forge its freshness marks.
    let changes = format!(
        "[changes]\nenabled = true\ntables = [\"items\"]\nurl = \"{}\"\n",
        pg.url_as("ferry_changes")
    );
    let changes = changes.as_str();
    refused_with(&pg, &[], changes, "");
    c.batch_execute(&format!("GRANT EXECUTE ON {emit} TO ferry_app"))
        .expect("grant");
    refused_with(
        &pg,
        &[],
        changes,
        "forge the change stream's freshness marks",
    );
    c.batch_execute(&format!("REVOKE EXECUTE ON {emit} FROM ferry_app"))
        .expect("revoke");
    // A request role that reads every session's statements, Ferry's proofs included.
    c.batch_execute("GRANT pg_read_all_stats TO ferry_app")
        .expect("grant");
    refused_with(&pg, &[], "", "pg_read_all_stats");
    c.batch_execute("REVOKE pg_read_all_stats FROM ferry_app")
        .expect("revoke");
    // The requests' role given a way into the books.
    c.batch_execute(
        "CREATE TABLE IF NOT EXISTS ferry.nonces (nonce bytea PRIMARY KEY, \
         expires_at timestamptz NOT NULL, rows_affected bigint); \
         ALTER TABLE ferry.nonces OWNER TO ferry_owner; \
         GRANT INSERT ON ferry.nonces TO ferry_app",
    )
    .expect("grant");
    refused_with(&pg, &[], "", "may write Ferry's books");
    c.batch_execute(
        "REVOKE INSERT ON ferry.nonces FROM ferry_app; GRANT CREATE ON SCHEMA ferry TO ferry_app",
    )
    .expect("grant");
    refused_with(&pg, &[], "", "may create in");
}

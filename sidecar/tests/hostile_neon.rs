//! The Neon door (`POST /sql`) against a token holder: the binary runs with the demo schema's
//! roles kept apart (requests as `ferry_app`, Ferry's books as `ferry_owner`), one read-only
//! token (`ferry_neon_ro`) and one read-write token (`ferry_neon`). Postgres's own view judges:
//! the rows, `pg_db_role_setting`, and the settings a fresh session gets.
use ferry_testkit::doors::config_file;
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const RO: &str = "neon-read-only-token-0123456789abcdefghij";
const RW: &str = "neon-read-write-token-0123456789abcdefghi";

fn config(pg: &PgServer) -> tempfile::NamedTempFile {
    config_file(&format!(
        "[neon]\nenabled = true\n\
         [[neon.tokens]]\ntoken = \"{RO}\"\nread_only = true\npostgres_url = \"{}\"\n\
         [[neon.tokens]]\ntoken = \"{RW}\"\npostgres_url = \"{}\"\n",
        pg.url_as("ferry_neon_ro"),
        pg.url_as("ferry_neon")
    ))
}

fn start(redis: &RedisServer, pg: &PgServer, file: &tempfile::NamedTempFile) -> SidecarProcess {
    let path = file.path().to_str().expect("utf-8 path");
    SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url_as("ferry_app"),
        &[("FERRY_CONFIG", path)],
        Stdio::null(),
    )
}

fn item_name(pg: &PgServer, id: i32) -> String {
    pg.client()
        .query_one("SELECT name FROM items WHERE id = $1", &[&id])
        .expect("item")
        .get(0)
}

#[test]
fn a_read_only_token_cannot_write_by_any_path() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let file = config(&pg);
    let s = start(&redis, &pg, &file);
    let before = item_name(&pg, 1);
    for (what, sql) in [
        (
            "a DO block that commits the read-only transaction and writes in the next",
            "DO $$BEGIN COMMIT; SET TRANSACTION READ WRITE; \
             UPDATE items SET name = 'pwned' WHERE id = 1; END$$",
        ),
        ("a procedure call", "CALL no_such_procedure()"),
        (
            "a plain write",
            "UPDATE items SET name = 'pwned' WHERE id = 1",
        ),
        (
            "a write inside a data-modifying CTE",
            "WITH w AS (UPDATE items SET name = 'pwned' WHERE id = 1 RETURNING 1) \
             SELECT * FROM w",
        ),
        (
            "a write run from a string by query_to_xml",
            "SELECT query_to_xml('UPDATE items SET name = ''pwned'' WHERE id = 1 \
             RETURNING 1', true, true, '')",
        ),
        (
            "a large object, which Postgres writes even in a read-only transaction",
            "SELECT lo_from_bytea(0, 'written')",
        ),
    ] {
        let single = s.client.neon(RO, json!({ "query": sql }), &[]);
        assert_eq!(single.status, 400, "{what}: {}", single.body);
        let batch = s.client.neon(
            RO,
            json!({ "queries": [{ "query": "SELECT 1" }, { "query": sql }] }),
            &[],
        );
        assert_eq!(batch.status, 400, "{what} (in a batch): {}", batch.body);
        assert_eq!(item_name(&pg, 1), before, "{what} changed the row");
    }
    // Empty statements in front (Postgres drops them; a prepare sees one statement): a COMMIT
    // that ends the batch's read-only transaction, then a write in the next (an attacker's
    // review found it written, 200).
    let escape = s.client.neon(
        RO,
        json!({ "queries": [
            { "query": ";COMMIT" },
            { "query": "SELECT set_config('default_transaction_read_only', 'off', false)" },
            { "query": "UPDATE items SET name = 'pwned' WHERE id = 1" },
        ] }),
        &[],
    );
    assert_eq!(escape.status, 400, "{}", escape.body);
    assert_eq!(item_name(&pg, 1), before, "a write after ;COMMIT");
    let objects: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM pg_largeobject_metadata", &[])
        .expect("pg_largeobject_metadata")
        .get(0);
    assert_eq!(objects, 0, "a large object was written");
    let refused = s
        .client
        .neon(RO, json!({ "query": "DO $$BEGIN END$$" }), &[]);
    assert_eq!(
        refused.body["code"], "statement_not_allowed",
        "{}",
        refused.body
    );
    // The token still reads, and the same DO block from the read-write token runs.
    let read = s.client.neon(
        RO,
        json!({ "query": "SELECT name FROM items WHERE id = 1" }),
        &[],
    );
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(read.body["rows"][0]["name"], before.as_str());
    let rw = s
        .client
        .neon(RW, json!({ "query": "DO $$BEGIN END$$" }), &[]);
    assert_eq!(rw.status, 200, "{}", rw.body);

    // A line comment ended by a carriage return hides nothing (Postgres's lexer ends it there).
    for sql in [
        "--\rLISTEN x",
        "--\rDO $$BEGIN END$$",
        "--\rSET work_mem = '77MB'",
        // Nor do empty statements in front.
        ";LISTEN x",
        "; ;DO $$BEGIN END$$",
        ";SET work_mem = '77MB'",
        " ; /* c */ ;COMMIT",
        ";CALL no_such_procedure()",
    ] {
        let hidden = s.client.neon(RO, json!({ "query": sql }), &[]);
        assert_eq!(
            hidden.body["code"], "statement_not_allowed",
            "{sql:?}: {}",
            hidden.body
        );
    }
    // Values that are not UTF-8 (client_encoding changed by the read itself) are refused, and
    // the worker goes on serving: the next read on the same token answers.
    let latin = s.client.neon(
        RO,
        json!({ "query": "SELECT set_config('client_encoding', 'LATIN1', false), 'é'::text" }),
        &[],
    );
    assert_eq!(latin.status, 400, "{}", latin.body);
    for _ in 0..4 {
        let next = s
            .client
            .neon(RO, json!({ "query": "SELECT 'é' AS e" }), &[]);
        assert_eq!(next.status, 200, "{}", next.body);
        assert_eq!(next.body["rows"][0]["e"], "é");
    }
}

/// What `DO` sets on a role for every later session of it (no text check sees it).
fn alter_own_role() -> String {
    let set = |what: &str| format!("EXECUTE 'ALTER ROLE ' || current_user || ' SET {what}';");
    format!(
        "DO $$BEGIN {} {} {} {} {} END$$",
        set("synchronous_commit = off"),
        set("lock_timeout = ''1ms''"),
        set("DateStyle = ''SQL, DMY''"),
        set("bytea_output = escape"),
        set("role = ''authenticated''"),
    )
}

const SEEN: &str =
    "SELECT current_user::text AS who, current_setting('synchronous_commit') AS sc, \
    current_setting('lock_timeout') AS lt, current_setting('DateStyle') AS ds, \
    current_setting('bytea_output') AS bo";

fn settings_stored(pg: &PgServer, role: &str) -> i64 {
    pg.client()
        .query_one(
            "SELECT count(*) FROM pg_db_role_setting s, unnest(s.setconfig) \
             WHERE s.setrole = $1::text::regrole",
            &[&role],
        )
        .expect("pg_db_role_setting")
        .get(0)
}

fn assert_pinned(row: &serde_json::Value, role: &str) {
    assert_eq!(row["who"], role, "{row}");
    assert_eq!(row["sc"], "on", "{row}");
    assert_eq!(row["lt"], "0", "{row}");
    assert_eq!(row["ds"], "ISO, MDY", "{row}");
    assert_eq!(row["bo"], "hex", "{row}");
}

#[test]
fn settings_a_caller_gives_its_role_never_reach_ferrys_sessions() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let file = config(&pg);
    let mut s = start(&redis, &pg, &file);
    // Said plainly, the statement is refused, on both doors.
    let plain = s.client.neon(
        RW,
        json!({ "query": "ALTER ROLE ferry_neon SET lock_timeout = '1ms'" }),
        &[],
    );
    assert_eq!(plain.status, 400, "{}", plain.body);
    assert_eq!(
        plain.body["code"], "statement_not_allowed",
        "{}",
        plain.body
    );
    let plain = s
        .client
        .execute(json!({ "sql": "ALTER ROLE ferry_app SET lock_timeout = '1ms'" }));
    assert_eq!(plain.status, 400, "{}", plain.body);
    // Inside a DO block no text check sees it: Postgres takes it, for the token's own role
    // and (raw SQL on /v1) for the requests' role.
    let hidden = s.client.neon(RW, json!({ "query": alter_own_role() }), &[]);
    assert_eq!(hidden.status, 200, "{}", hidden.body);
    let hidden = s.client.execute(json!({ "sql": alter_own_role() }));
    assert_eq!(hidden.status, 200, "{}", hidden.body);
    assert_eq!(
        settings_stored(&pg, "ferry_neon"),
        5,
        "the attack reached the token's role"
    );
    assert_eq!(
        settings_stored(&pg, "ferry_app"),
        5,
        "the attack reached the requests' role"
    );

    // Fresh sessions everywhere: a restart.
    s.terminate();
    let s = start(&redis, &pg, &file);
    let v1 = s.client.query(json!({ "sql": SEEN }));
    assert_eq!(v1.status, 200, "{}", v1.body);
    assert_pinned(&v1.body["rows"][0], "ferry_app");
    let neon = s.client.neon(RW, json!({ "query": SEEN }), &[]);
    assert_eq!(neon.status, 200, "{}", neon.body);
    assert_pinned(&neon.body["rows"][0], "ferry_neon");
    // Every door still serves: a read, a write (its outcome recorded), a Neon read with a date.
    let item = s
        .client
        .query(json!({ "sql": "SELECT name FROM items WHERE id = 2" }));
    assert_eq!(item.status, 200, "{}", item.body);
    let write = s.client.execute(json!({
        "sql": "UPDATE items SET name = 'still writable' WHERE id = 3"
    }));
    assert_eq!(write.status, 200, "{}", write.body);
    let date = s.client.neon(
        RW,
        json!({ "query": "SELECT '2024-03-01'::date AS d" }),
        &[],
    );
    assert_eq!(date.body["rows"][0]["d"], "2024-03-01", "{}", date.body);
    // And the probe says the requests' role carries settings of its own.
    ferry_testkit::wait_until(
        "the probe to report the role's settings",
        std::time::Duration::from_secs(10),
        || s.metric("ferry_postgres_role_settings") == Some(5.0),
    );
}

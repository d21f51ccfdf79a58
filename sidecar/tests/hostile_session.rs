//! The hostile caller (holding the secret, raw SQL switched on) against the binary with a
//! Postgres pool of ONE connection, so every request reuses the previous one's session. Each
//! attack tries to leave something behind on that connection; Postgres's own view
//! (`pg_stat_activity`, `pg_locks`, `pg_class`, the rows) judges whether it did. The same
//! attacks are then sent as reads to a sidecar with one worker and a pool of two: its one
//! event-loop session (`store/postgres/loop_session.rs`) serves every read.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

struct Target {
    _redis: RedisServer,
    pg: PgServer,
    sidecar: SidecarProcess,
}

fn start() -> Target {
    start_with(&[("FERRY_POSTGRES_POOL_SIZE", "1")])
}

/// One worker, a pool of two: one event-loop session for reads, one pooled for the rest.
fn start_event_loop() -> Target {
    start_with(&[
        ("FERRY_SERVER_WORKERS", "1"),
        ("FERRY_POSTGRES_POOL_SIZE", "2"),
    ])
}

fn start_with(pool: &[(&str, &str)]) -> Target {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let sidecar = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            pool,
            &[
                ("FERRY_POSTGRES_MIN_IDLE", "1"),
                ("FERRY_POSTGRES_STATEMENT_TIMEOUT_MS", "1000"),
                ("FERRY_AUTH_ALLOW_RAW_SQL", "true"),
            ],
        ]
        .concat(),
        Stdio::null(),
    );
    Target {
        _redis: redis,
        pg,
        sidecar,
    }
}

impl Target {
    fn query(&self, sql: &str) -> ferry_testkit::client::Answer {
        self.sidecar.client.query(json!({ "sql": sql }))
    }

    fn execute(&self, sql: &str) -> ferry_testkit::client::Answer {
        self.sidecar.client.execute(json!({ "sql": sql }))
    }

    /// What Postgres says about each of the sidecar's backends: (state, xact open,
    /// application_name).
    fn backends(&self) -> Vec<(String, bool, String)> {
        let rows = self
            .pg
            .client()
            .query(
                "SELECT coalesce(state, ''), xact_start IS NOT NULL, application_name
                 FROM pg_stat_activity WHERE backend_type = 'client backend'
                   AND pid <> pg_backend_pid() AND datname = current_database()",
                &[],
            )
            .expect("pg_stat_activity");
        assert!(!rows.is_empty(), "the sidecar has a backend");
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// Locks held by backends other than the judge's own (advisory or on relations).
    fn foreign_locks(&self) -> i64 {
        self.pg
            .client()
            .query_one(
                "SELECT count(*) FROM pg_locks l
                 WHERE l.pid <> pg_backend_pid() AND l.locktype IN ('advisory', 'relation')",
                &[],
            )
            .expect("pg_locks")
            .get(0)
    }

    fn temp_relations(&self) -> i64 {
        self.pg
            .client()
            .query_one(
                "SELECT count(*) FROM pg_class WHERE relpersistence = 't'",
                &[],
            )
            .expect("pg_class")
            .get(0)
    }

    fn item_name(&self, id: i32) -> String {
        self.pg
            .client()
            .query_one("SELECT name FROM items WHERE id = $1", &[&id])
            .expect("item")
            .get(0)
    }

    /// The connection is as fresh as a new one: idle, no transaction, its own name, no locks,
    /// no temp objects, no cursors, listeners or SQL-level prepared statements.
    fn assert_fresh(&self, after: &str) {
        for (state, in_xact, app) in self.backends() {
            assert_eq!(state, "idle", "after {after}: backend state");
            assert!(!in_xact, "after {after}: a transaction is left open");
            assert_eq!(
                app, "ferry-sidecar",
                "after {after}: application_name changed"
            );
        }
        assert_eq!(self.foreign_locks(), 0, "after {after}: locks left held");
        assert_eq!(self.temp_relations(), 0, "after {after}: temp objects left");
        let seen = self.query(
            "SELECT (SELECT count(*) FROM pg_cursors WHERE is_holdable)::int AS cursors,
                    (SELECT count(*) FROM pg_listening_channels())::int AS channels,
                    (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)::int AS prepared,
                    current_setting('statement_timeout') AS timeout,
                    current_setting('search_path') AS search_path,
                    current_user::text AS who",
        );
        assert_eq!(seen.status, 200, "{:?}", seen.body);
        let row = &seen.body["rows"][0];
        assert_eq!(row["cursors"], 0, "after {after}: {row}");
        assert_eq!(row["channels"], 0, "after {after}: {row}");
        assert_eq!(row["prepared"], 0, "after {after}: {row}");
        assert_eq!(row["timeout"], "1s", "after {after}: {row}");
        assert_eq!(
            row["search_path"], "\"$user\", public",
            "after {after}: {row}"
        );
        assert_eq!(row["who"], "postgres", "after {after}: {row}");
    }

    /// A function of the database that runs SQL it is given (dynamic SQL, which no statement
    /// check sees) makes, inside a read, a prepared statement, a cursor that outlives its
    /// transaction and a listener. A reset that stopped deallocating (to keep Ferry's own
    /// statements prepared) would leave the statement to the next request.
    fn dynamic_sql_leaves_nothing(&self) {
        self.pg
            .client()
            .batch_execute(
                "CREATE FUNCTION ferry_run(t text) RETURNS int LANGUAGE plpgsql AS
                 $$ BEGIN EXECUTE t; RETURN 1; END $$",
            )
            .expect("function");
        for sql in [
            "SELECT ferry_run('PREPARE left_behind AS SELECT 1') AS r",
            "SELECT ferry_run('DECLARE left_open CURSOR WITH HOLD FOR SELECT 1') AS r",
            "SELECT ferry_run('LISTEN left_listening') AS r",
        ] {
            // Twice: the session that ran it is never handed on as it was left.
            for _ in 0..2 {
                let a = self.query(sql);
                assert_eq!(a.status, 200, "{sql}: {:?}", a.body);
                self.assert_fresh(sql);
            }
        }
    }
}

fn refused(a: &ferry_testkit::client::Answer, class: &str) {
    assert_eq!(a.status, 400, "{:?}", a.body);
    assert_eq!(a.code(), "statement_not_allowed", "{:?}", a.body);
    let message = a.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(class),
        "message names {class:?}: {message}"
    );
}

#[test]
fn an_open_transaction_cannot_swallow_a_later_write() {
    let t = start();
    for sql in [
        "BEGIN",
        "begin isolation level serializable",
        "  /* hidden */ -- and more\n START TRANSACTION",
        "/* nested /* comment */ */ BEGIN",
        "SAVEPOINT s",
        "COMMIT",
        "ROLLBACK",
        "PREPARE TRANSACTION 'x'",
        "END",
        "ABORT",
        // Empty statements in front: Postgres drops them, and sees one BEGIN.
        ";BEGIN",
        " ; ;/* c */; START TRANSACTION",
    ] {
        refused(&t.execute(sql), "transaction control");
        refused(&t.query(sql), "transaction control");
    }
    t.assert_fresh("transaction control attempts");
    // A write acknowledged after them is committed: Postgres has the row.
    let w = t.execute("UPDATE items SET name = 'committed' WHERE id = 1");
    assert_eq!(w.status, 200, "{:?}", w.body);
    assert_eq!(w.body["rows_affected"], 1);
    assert_eq!(t.item_name(1), "committed");
    t.assert_fresh("the write");
}

#[test]
fn session_settings_cannot_outlive_their_request() {
    let t = start();
    for sql in [
        "SET statement_timeout = 0",
        "set local statement_timeout = 0",
        "SET SESSION AUTHORIZATION DEFAULT",
        "RESET ALL",
        "SET search_path = pg_temp, public",
        "DISCARD ALL",
        "LISTEN ch",
        "UNLISTEN *",
        "LOAD 'auto_explain'",
        "PREPARE p AS SELECT 1",
        "EXECUTE p",
        "DEALLOCATE ALL",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
        "FETCH ALL FROM c",
        "CLOSE c",
        "LOCK TABLE items",
        "CREATE TEMP TABLE items (id int)",
        "create global temporary table x (id int)",
        "COPY items TO STDOUT",
    ] {
        let a = t.execute(sql);
        assert_eq!(a.status, 400, "{sql}: {:?}", a.body);
        assert_eq!(a.code(), "statement_not_allowed", "{sql}: {:?}", a.body);
    }
    // The same changes made through functions, which no statement check can see.
    for sql in [
        "SELECT set_config('statement_timeout', '0', false)",
        "SELECT set_config('search_path', 'pg_temp, public', false)",
        "SELECT set_config('application_name', 'evil', false)",
        "SELECT pg_advisory_lock(42)",
        "SELECT pg_advisory_lock_shared(43)",
    ] {
        let a = t.execute(sql);
        assert_eq!(a.status, 200, "{sql}: {:?}", a.body);
        t.assert_fresh(sql);
    }
    t.dynamic_sql_leaves_nothing();
    // A temp table made through SELECT INTO in a write, which would shadow public.items.
    let a = t.execute("SELECT 7 AS id INTO TEMP TABLE items");
    assert!(a.status == 200 || a.status == 400, "{:?}", a.body);
    t.assert_fresh("SELECT INTO TEMP");
    let count = t.query("SELECT count(*)::int AS n FROM items");
    assert_eq!(
        count.body["rows"][0]["n"], 1000,
        "public.items is what reads see"
    );
    // The statement timeout still holds for the next request.
    let slow = t.query("SELECT pg_sleep(3)::text AS s");
    assert_eq!(slow.status, 504, "{:?}", slow.body);
    assert_eq!(slow.code(), "timeout");
    // The 504 goes at the deadline; the statement's cancel and its session's close follow
    // (`store/postgres/deadline.rs`: never pooled again). Judged once that session is gone: a
    // backend left running would still fail here.
    ferry_testkit::wait_until(
        "the timed-out statement's backend to end",
        std::time::Duration::from_secs(5),
        || t.backends().iter().all(|(state, _, _)| state == "idle"),
    );
    t.assert_fresh("the timed-out statement");
}

#[test]
fn reads_are_read_only() {
    let t = start();
    let before = t.item_name(2);
    for sql in [
        "UPDATE items SET name = 'x' WHERE id = 2 RETURNING id",
        "DELETE FROM items WHERE id = 2",
        "INSERT INTO items (id, name, price) VALUES (5000, 'x', 1)",
        "CALL nothing()",
    ] {
        refused(&t.query(sql), "read");
    }
    // Writes hidden in a read: a data-modifying CTE, a volatile function, SELECT INTO.
    t.pg.client()
        .batch_execute(
            "CREATE FUNCTION ferry_hostile_write() RETURNS int LANGUAGE sql VOLATILE AS
               $$ UPDATE items SET name = 'x' WHERE id = 2 RETURNING id $$",
        )
        .expect("create function");
    for sql in [
        "WITH u AS (UPDATE items SET name = 'x' WHERE id = 2 RETURNING id) SELECT * FROM u",
        "SELECT ferry_hostile_write() AS id",
        "SELECT * INTO items_copy FROM items",
    ] {
        let a = t.query(sql);
        assert_eq!(a.status, 400, "{sql}: {:?}", a.body);
        assert_eq!(a.body["error"]["pg_code"], "25006", "{sql}: {:?}", a.body);
    }
    assert_eq!(t.item_name(2), before, "no read changed a row");
    t.assert_fresh("writes sent as reads");
    // Batches are reads too.
    let b = t.sidecar.client.block_on(t.sidecar.client.post(
        "/v1/batch",
        &json!({"reads": [
            {"sql": "SELECT ferry_hostile_write() AS id"},
            {"sql": "UPDATE items SET name = 'x' WHERE id = 2"}
        ]}),
    ));
    assert_eq!(b.status, 200, "{:?}", b.body);
    let codes: Vec<Value> = b.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["error"]["code"].clone())
        .collect();
    assert_eq!(
        codes,
        vec![json!("sql_error"), json!("statement_not_allowed")]
    );
    assert_eq!(t.item_name(2), before);
}

#[test]
fn reads_on_the_event_loop_leave_nothing_behind() {
    let t = start_event_loop();
    // The same changes made by functions inside reads: they run on the worker's one
    // event-loop session, which the next read (assert_fresh's own) reuses.
    for sql in [
        "SELECT set_config('statement_timeout', '0', false)",
        "SELECT set_config('search_path', 'pg_temp, public', false)",
        "SELECT set_config('application_name', 'evil', false)",
        "SELECT pg_advisory_lock(42)::text AS l",
        "SELECT pg_advisory_lock_shared(43)::text AS l",
    ] {
        let a = t.query(sql);
        assert_eq!(a.status, 200, "{sql}: {:?}", a.body);
        t.assert_fresh(sql);
    }
    t.dynamic_sql_leaves_nothing();
    // A write hidden in a read is refused by Postgres, there too.
    let a = t.query(
        "WITH d AS (UPDATE items SET name = 'owned' WHERE id = 1 RETURNING id) SELECT id FROM d",
    );
    assert_ne!(a.status, 200, "{:?}", a.body);
    assert_ne!(t.item_name(1), "owned");
    // Refused statements never reach a session.
    refused(&t.query("BEGIN"), "transaction");
    // The statement timeout still holds for the next read.
    let slow = t.query("SELECT pg_sleep(3)::text AS s");
    assert_eq!(slow.status, 504, "{:?}", slow.body);
    t.assert_fresh("the timed-out statement");
    let events = t.query("SELECT count(*)::int AS n FROM items");
    assert_eq!(events.body["rows"][0]["n"], 1000, "{:?}", events.body);
}

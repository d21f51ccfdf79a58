//! `/v1/transaction` against the binary with a pool of one connection, so every request reuses
//! the session the last one left: all statements commit or none does, the failing one is
//! named, nothing outlives the request, and the invalidations follow the commit. Postgres's
//! rows, pg_stat_activity and pg_locks judge.
use ferry_testkit::{client::Answer, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn start() -> (RedisServer, PgServer, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let env = [
        ("FERRY_CONFIG", sample),
        ("FERRY_POSTGRES_POOL_SIZE", "1"),
        ("FERRY_SERVER_WORKERS", "1"),
    ];
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    (redis, pg, s)
}

fn tx(s: &SidecarProcess, body: Value) -> Answer {
    s.client.block_on(s.client.post("/v1/transaction", &body))
}

fn name(pg: &PgServer, id: i32) -> Option<String> {
    pg.client()
        .query_opt("SELECT name FROM items WHERE id = $1", &[&id])
        .expect("select")
        .map(|r| r.get(0))
}

/// What the sidecar's backends hold: transactions left open and locks. A leftover lasts (until
/// Postgres's idle timeout, seconds); a background probe's `SELECT 1` caught in passing does
/// not, so a nonzero count is looked at again for up to a second.
fn leftovers(pg: &PgServer) -> (i64, i64) {
    let mut seen = held_now(pg);
    for _ in 0..10 {
        if seen == (0, 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        seen = held_now(pg);
    }
    seen
}

fn held_now(pg: &PgServer) -> (i64, i64) {
    let mut c = pg.client();
    let open: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ferry-sidecar' \
             AND state <> 'idle'",
            &[],
        )
        .expect("activity")
        .get(0);
    let locks: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE a.application_name = 'ferry-sidecar' AND l.locktype <> 'virtualxid'",
            &[],
        )
        .expect("locks")
        .get(0);
    (open, locks)
}

#[test]
fn all_or_nothing_and_the_failing_statement_is_named() {
    let (_redis, pg, s) = start();
    let a = tx(
        &s,
        json!({"statements": [
            {"sql": "INSERT INTO items (id, name, price) VALUES (6000, 'new', 1) RETURNING id"},
            {"sql": "UPDATE items SET name = 'changed' WHERE id = 1"},
            {"sql": "INSERT INTO items (id, name, price) VALUES (2, 'duplicate', 1)"},
        ]}),
    );
    assert_eq!(a.status, 400, "{:?}", a.body);
    assert_eq!(a.body["error"]["code"], "sql_error");
    assert_eq!(a.body["error"]["pg_code"], "23505");
    assert_eq!(a.body["error"]["statement"], 2);
    assert_eq!(a.body["error"]["field"], "statements[2]");
    assert_eq!(name(&pg, 6000), None, "statement 0 was rolled back");
    assert_eq!(name(&pg, 1).as_deref(), Some("item 1"), "statement 1 too");
    assert_eq!(
        leftovers(&pg),
        (0, 0),
        "no transaction or lock outlives the request"
    );

    // The same (only) session serves the next request, in no transaction of the last one's.
    let ok = tx(
        &s,
        json!({"statements": [
            {"sql": "INSERT INTO items (id, name, price) VALUES (6000, 'new', 1) RETURNING id"},
            {"sql": "UPDATE items SET name = 'changed' WHERE id = 1"},
        ]}),
    );
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!(ok.body["results"][0]["rows"], json!([{"id": 6000}]));
    assert_eq!(ok.body["results"][1]["rows_affected"], 1);
    assert_eq!(name(&pg, 6000).as_deref(), Some("new"));
    assert_eq!(name(&pg, 1).as_deref(), Some("changed"));
    assert_eq!(leftovers(&pg), (0, 0));
}

#[test]
fn statements_that_would_escape_the_transaction_are_refused_before_any_runs() {
    let (_redis, pg, s) = start();
    for (escape, class) in [
        ("COMMIT", "transaction control"),
        ("ROLLBACK", "transaction control"),
        ("SAVEPOINT a", "transaction control"),
        ("SET statement_timeout = 0", "session state"),
        ("LOCK items", "session state"),
        ("/* x */ begin", "transaction control"),
    ] {
        let a = tx(
            &s,
            json!({"statements": [
                {"sql": "UPDATE items SET name = 'escaped' WHERE id = 3"},
                {"sql": escape},
                {"sql": "UPDATE items SET name = 'after' WHERE id = 4"},
            ]}),
        );
        assert_eq!(a.status, 400, "{escape}: {:?}", a.body);
        assert_eq!(a.body["error"]["code"], "statement_not_allowed", "{escape}");
        assert_eq!(a.body["error"]["statement"], 1, "{escape}");
        let message = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(class), "{escape}: {message}");
        assert_eq!(
            name(&pg, 3).as_deref(),
            Some("item 3"),
            "{escape}: nothing ran"
        );
    }
    assert_eq!(leftovers(&pg), (0, 0));
}

#[test]
fn options_apply_and_read_only_refuses_writes() {
    let (_redis, pg, s) = start();
    let a = tx(
        &s,
        json!({"isolation": "serializable", "read_only": true, "deferrable": true,
               "statements": [{"sql": "SELECT current_setting('transaction_isolation') AS i, \
                   current_setting('transaction_read_only') AS ro, \
                   current_setting('transaction_deferrable') AS d"}]}),
    );
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        a.body["results"][0]["rows"],
        json!([{"i": "serializable", "ro": "on", "d": "on"}])
    );
    let refused = tx(
        &s,
        json!({"read_only": true, "statements": [
            {"sql": "SELECT 1"},
            {"sql": "UPDATE items SET name = 'ro' WHERE id = 5"},
        ]}),
    );
    assert_eq!(
        refused.body["error"]["pg_code"], "25006",
        "{:?}",
        refused.body
    );
    assert_eq!(refused.body["error"]["statement"], 1);
    assert_eq!(name(&pg, 5).as_deref(), Some("item 5"));
    // A later plain read-write request is not read-only: the options died with the transaction.
    let w = tx(
        &s,
        json!({"statements": [{"sql": "UPDATE items SET name = 'rw' WHERE id = 5"}]}),
    );
    assert_eq!(w.status, 200, "{:?}", w.body);
    let level = s
        .client
        .query(json!({"sql": "SELECT current_setting('transaction_isolation') AS i"}));
    assert_eq!(level.body["rows"][0]["i"], "read committed");
}

#[test]
fn bad_requests_are_refused_with_their_field() {
    let (_redis, _pg, s) = start();
    let many: Vec<Value> = (0..101).map(|_| json!({"sql": "SELECT 1"})).collect();
    for (body, field) in [
        (json!({"statements": []}), "statements"),
        (json!({"statements": many}), "statements"),
        (
            json!({"statements": [{"sql": "SELECT 1", "query": "item"}]}),
            "statements[0].sql",
        ),
        (
            json!({"statements": [{"query": "nope"}]}),
            "statements[0].query",
        ),
        (
            json!({"statements": [{"sql": "SELECT 1"}], "invalidate": {"tables": ["a b"]}}),
            "invalidate.tables[0]",
        ),
    ] {
        let a = tx(&s, body);
        assert_eq!(a.status, 400, "{field}: {:?}", a.body);
        assert_eq!(a.body["error"]["field"], field, "{:?}", a.body);
    }
    let bad_isolation = tx(
        &s,
        json!({"isolation": "chaos", "statements": [{"sql": "SELECT 1"}]}),
    );
    assert_eq!(bad_isolation.body["error"]["code"], "bad_request");
}

#[test]
fn invalidations_follow_the_commit() {
    let (_redis, _pg, s) = start();
    let read = |id: i32| {
        let a = s.client.query(json!({
            "sql": "SELECT name FROM items WHERE id = $1", "params": [id],
            "cache": {"ttl_s": 600, "key": format!("items:{id}"), "tables": ["items"]},
        }));
        (
            a.body["rows"][0]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            a.body["cache"].as_str().unwrap_or_default().to_string(),
        )
    };
    read(1);
    read(2);
    assert_eq!(read(1).1, "hit");
    assert_eq!(read(2).1, "hit");
    let a = tx(
        &s,
        json!({"statements": [
            {"sql": "UPDATE items SET name = 'one' WHERE id = 1"},
            {"sql": "UPDATE items SET name = 'two' WHERE id = 2"},
        ], "invalidate": {"keys": ["items:1"], "tables": ["items"]}}),
    );
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body["invalidation"], "done");
    assert_eq!(read(1).0, "one", "by key");
    assert_eq!(read(2).0, "two", "by table");
    // A failed transaction invalidates nothing: the entries stay.
    assert_eq!(read(1).1, "hit");
    let failed = tx(
        &s,
        json!({"statements": [{"sql": "UPDATE items SET price = 1 / 0 WHERE id = 1"}],
               "invalidate": {"keys": ["items:1"]}}),
    );
    assert_eq!(failed.body["error"]["pg_code"], "22012");
    assert_eq!(read(1).1, "hit");
}

//! Interactive transactions against the binary: what commits is seen, what rolls back is not,
//! and a transaction a caller abandons (holding a row lock) is rolled back at its idle timeout
//! or its lifetime, whatever the caller does. Postgres's rows, pg_locks and pg_stat_activity
//! judge.
use ferry_testkit::{client::Answer, wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const OTHER_SECRET: &str = "another-accepted-secret-0123456789abcdef";

fn start() -> (RedisServer, PgServer, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let env = [
        ("FERRY_CONFIG", sample),
        // Two workers' sessions take two; the three pooled ones hold two transactions and
        // leave one to writes (a cap that took all of them is refused).
        ("FERRY_POSTGRES_POOL_SIZE", "5"),
        ("FERRY_LIMITS_MAX_OPEN_TRANSACTIONS", "2"),
        ("FERRY_LIMITS_TRANSACTION_IDLE_TIMEOUT_MS", "500"),
        ("FERRY_LIMITS_TRANSACTION_MAX_LIFETIME_MS", "2000"),
        // A rotation in progress: requests signed with either secret are accepted.
        ("FERRY_AUTH_PREVIOUS_SECRET", OTHER_SECRET),
    ];
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    (redis, pg, s)
}

fn post(s: &SidecarProcess, path: &str, body: Value) -> Answer {
    s.client.block_on(s.client.post(path, &body))
}

fn begin(s: &SidecarProcess) -> String {
    let a = post(s, "/v1/transaction/begin", json!({}));
    assert_eq!(a.status, 200, "{:?}", a.body);
    a.body["id"].as_str().unwrap_or_default().to_string()
}

fn in_tx(s: &SidecarProcess, id: &str, sql: &str) -> Answer {
    post(s, "/v1/transaction/query", json!({"id": id, "sql": sql}))
}

fn name(pg: &PgServer, id: i32) -> String {
    pg.client()
        .query_one("SELECT name FROM items WHERE id = $1", &[&id])
        .expect("select")
        .get(0)
}

/// Sidecar backends in a transaction, and the row locks they hold.
fn held(pg: &PgServer) -> (i64, i64) {
    let mut c = pg.client();
    let in_tx: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ferry-sidecar' \
             AND state LIKE 'idle in transaction%'",
            &[],
        )
        .expect("activity")
        .get(0);
    let locks: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE a.application_name = 'ferry-sidecar' AND l.locktype = 'transactionid'",
            &[],
        )
        .expect("locks")
        .get(0);
    (in_tx, locks)
}

#[test]
fn commit_is_seen_rollback_is_not_and_nothing_escapes() {
    let (_redis, pg, s) = start();
    let id = begin(&s);
    let a = in_tx(&s, &id, "UPDATE items SET name = 'inside' WHERE id = 1");
    assert_eq!(a.body["rows_affected"], 1, "{:?}", a.body);
    assert_eq!(name(&pg, 1), "item 1", "not visible before the commit");
    // Statements that would end or escape the transaction are refused; it stays usable.
    for escape in ["COMMIT", "ROLLBACK", "SET statement_timeout = 0", "BEGIN"] {
        let r = in_tx(&s, &id, escape);
        assert_eq!(r.body["error"]["code"], "statement_not_allowed", "{escape}");
    }
    let seen = in_tx(&s, &id, "SELECT name FROM items WHERE id = 1");
    assert_eq!(
        seen.body["rows"],
        json!([{"name": "inside"}]),
        "its own write"
    );
    let c = post(&s, "/v1/transaction/commit", json!({"id": id}));
    assert_eq!(c.body["committed"], true, "{:?}", c.body);
    assert_eq!(name(&pg, 1), "inside");
    let again = in_tx(&s, &id, "SELECT 1");
    assert_eq!(again.status, 404, "an ended transaction");
    assert_eq!(again.body["error"]["code"], "transaction_not_found");

    let id = begin(&s);
    in_tx(&s, &id, "UPDATE items SET name = 'undone' WHERE id = 2");
    let r = post(&s, "/v1/transaction/rollback", json!({"id": id}));
    assert_eq!(r.body["committed"], false, "{:?}", r.body);
    assert_eq!(name(&pg, 2), "item 2");
    assert_eq!(held(&pg), (0, 0));
    // A made-up id is unknown.
    let guess = in_tx(&s, &format!("{:032x}", 7u128), "SELECT 1");
    assert_eq!(guess.body["error"]["code"], "transaction_not_found");
}

/// A statement failed inside the transaction, so Postgres aborted it: its COMMIT is a
/// ROLLBACK (Postgres answers it without an error). Ferry must not acknowledge that as a
/// commit: the answer is an error saying nothing committed, and the rows agree.
/// The same whether or not the COMMIT records a nonce row (`auth.replay = "local"`: none).
#[test]
fn a_commit_after_a_failed_statement_is_not_acknowledged() {
    let (redis, pg, shared) = start();
    let env = [("FERRY_AUTH_REPLAY", "local")];
    let local = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    for s in [&shared, &local] {
        let id = begin(s);
        let a = in_tx(s, &id, "UPDATE items SET name = 'lost' WHERE id = 4");
        assert_eq!(a.body["rows_affected"], 1, "{:?}", a.body);
        let failed = in_tx(s, &id, "SELECT 1 / 0");
        assert_eq!(failed.status, 400, "{:?}", failed.body);
        let ignored = in_tx(s, &id, "SELECT 1");
        assert_eq!(ignored.code(), "transaction_aborted", "{:?}", ignored.body);
        let c = post(s, "/v1/transaction/commit", json!({"id": id}));
        assert_eq!(name(&pg, 4), "item 4", "Postgres rolled it back");
        assert_eq!(
            (c.status, c.code()),
            (409, "transaction_aborted"),
            "a rolled-back transaction acknowledged: {:?}",
            c.body
        );
        assert_eq!(held(&pg), (0, 0), "nothing left open");
        let again = in_tx(s, &id, "SELECT 1");
        assert_eq!(again.status, 404, "it ended");
    }
}

#[test]
fn an_abandoned_transaction_is_rolled_back_and_its_lock_released() {
    let (_redis, pg, s) = start();
    let id = begin(&s);
    let locked = in_tx(&s, &id, "UPDATE items SET name = 'abandoned' WHERE id = 3");
    assert_eq!(locked.status, 200, "{:?}", locked.body);
    assert_eq!(held(&pg).1, 1, "the row lock is held");
    let abandoned = Instant::now();
    // The caller never comes back. Postgres's view decides when the lock is gone.
    // Well before Postgres's own backstop (idle_in_transaction_session_timeout, 10 s here).
    wait_until("the lock to be released", Duration::from_secs(5), || {
        held(&pg) == (0, 0)
    });
    println!(
        "FIGURES idle: released {:?} after the last statement (idle timeout 500 ms)",
        abandoned.elapsed()
    );
    assert_eq!(name(&pg, 3), "item 3", "rolled back, not committed");
    pg.client()
        .execute("UPDATE items SET name = 'free' WHERE id = 3", &[])
        .expect("the row is free");
    assert_eq!(in_tx(&s, &id, "SELECT 1").status, 404);

    // Busy forever is no escape either: the lifetime (2 s) ends it.
    let id = begin(&s);
    let started = Instant::now();
    let mut last = 200;
    while started.elapsed() < Duration::from_secs(5) {
        last = in_tx(&s, &id, "UPDATE items SET name = 'busy' WHERE id = 4").status;
        if last == 404 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(last, 404, "still open after its lifetime");
    println!(
        "FIGURES lifetime: ended {:?} after begin (lifetime 2 s)",
        started.elapsed()
    );
    assert_eq!(name(&pg, 4), "item 4");
    assert_eq!(held(&pg), (0, 0));
}

#[test]
fn open_transactions_are_bounded_and_plain_requests_still_run() {
    let (_redis, _pg, s) = start();
    let (a, b) = (begin(&s), begin(&s));
    let third = post(&s, "/v1/transaction/begin", json!({}));
    assert_eq!(third.status, 503, "{:?}", third.body);
    assert_eq!(third.body["error"]["code"], "overloaded");
    // Two of five connections are held: reads still run.
    let read = s.client.query(json!({"sql": "SELECT 1 AS one"}));
    assert_eq!(read.body["rows"], json!([{"one": 1}]));
    // One statement at a time per transaction.
    let sleep = json!({"id": a, "sql": "SELECT 1 AS n FROM pg_sleep(0.8)"});
    let (slow, busy) = s.client.block_on(async {
        let slow = s.client.post("/v1/transaction/query", &sleep);
        let second = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            s.client
                .post(
                    "/v1/transaction/query",
                    &json!({"id": a, "sql": "SELECT 1"}),
                )
                .await
        };
        futures::join!(slow, second)
    });
    // Whichever reached the sidecar second (on a loaded machine either may) is refused.
    let mut statuses = [slow.status, busy.status];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{:?} / {:?}", slow.body, busy.body);
    let refused = if slow.status == 409 { &slow } else { &busy };
    assert_eq!(refused.body["error"]["code"], "transaction_busy");
    for id in [a, b] {
        post(&s, "/v1/transaction/rollback", json!({"id": id}));
    }
    assert_eq!(begin(&s).len(), 32, "room again");
}

/// A transaction id in the hands of another credential (a request signed with the other
/// accepted secret) finds nothing: it cannot run a statement in it, commit it or roll it back,
/// and the transaction is untouched for the credential that opened it.
#[test]
fn a_transaction_is_bound_to_the_credential_that_opened_it() {
    let (_redis, pg, s) = start();
    let id = begin(&s);
    let a = in_tx(&s, &id, "UPDATE items SET name = 'mine' WHERE id = 3");
    assert_eq!(a.body["rows_affected"], 1, "{:?}", a.body);
    let other = ferry_testkit::Client::new(&s.client.base, OTHER_SECRET);
    assert_eq!(
        other.query(json!({"sql": "SELECT 1"})).status,
        200,
        "the other secret is accepted"
    );
    let theirs = |path: &str, body: Value| other.block_on(other.post(path, &body));
    for (path, body) in [
        (
            "/v1/transaction/query",
            json!({"id": id, "sql": "UPDATE items SET name = 'theirs' WHERE id = 3"}),
        ),
        ("/v1/transaction/commit", json!({"id": id})),
        ("/v1/transaction/rollback", json!({"id": id})),
    ] {
        let r = theirs(path, body);
        assert_eq!(r.status, 404, "{path}: {:?}", r.body);
        assert_eq!(r.body["error"]["code"], "transaction_not_found", "{path}");
    }
    // Postgres's view: still open, not committed, not rolled back.
    assert_eq!(held(&pg).0, 1, "the transaction is still open");
    assert_eq!(name(&pg, 3), "item 3");
    let c = post(&s, "/v1/transaction/commit", json!({"id": id}));
    assert_eq!(c.body["committed"], true, "{:?}", c.body);
    assert_eq!(name(&pg, 3), "mine");
}

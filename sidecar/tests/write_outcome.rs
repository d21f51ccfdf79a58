//! A write fails cleanly or succeeds, never both, when its sidecar stops mid-write. Writes go
//! to one sidecar binary, which is frozen (SIGSTOP) while they run, so their callers get no
//! answer. Each caller then asks another sidecar for its write's outcome (`POST /v1/outcome`,
//! by the nonce it signed with). The frozen sidecar is then let go, and it tries to finish
//! every write it held. Postgres's rows judge: a write is there exactly when it was answered
//! 200 or its outcome said committed, and one said not committed never appears later.
use ferry_testkit::{client::nonce, client::now_s, Client, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn setup() -> (RedisServer, PgServer, SidecarProcess, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "CREATE TABLE outcome_t (id int PRIMARY KEY);
             -- Even ids take 300 ms to COMMIT (a deferred trigger runs then): a sidecar frozen
             -- meanwhile leaves a write committed that nobody was told about.
             CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON outcome_t
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id % 2 = 0)
               EXECUTE FUNCTION slow_commit();",
        )
        .expect("table");
    let env = [("FERRY_POSTGRES_POOL_SIZE", "40")];
    let start = || SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    let (a, b) = (start(), start());
    (redis, pg, a, b)
}

/// A write signed with `nonce`, or None when no answer came within `wait`.
async fn write_with(c: &Client, body: &Value, nonce: &str, wait: Duration) -> Option<(u16, Value)> {
    post_with(c, "/v1/execute", body, nonce, wait).await
}

/// `body` posted to `path`, signed with `nonce`; None when no answer came within `wait`.
async fn post_with(
    c: &Client,
    path: &str,
    body: &Value,
    nonce: &str,
    wait: Duration,
) -> Option<(u16, Value)> {
    let bytes = serde_json::to_vec(body).expect("json");
    let headers = c.headers_for("POST", path, &bytes, now_s(), nonce);
    let sent = c.send_raw("POST", path, bytes, &headers);
    let a = tokio::time::timeout(wait, sent).await.ok()?;
    Some((a.status, a.body))
}

fn outcome(c: &Client, nonce: &str) -> Value {
    let a = c.block_on(c.post("/v1/outcome", &json!({"nonce": nonce})));
    assert_eq!(a.status, 200, "{:?}", a.body);
    a.body
}

fn rows(pg: &PgServer) -> BTreeSet<i32> {
    pg.client()
        .query("SELECT id FROM outcome_t", &[])
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn a_write_whose_sidecar_froze_either_committed_or_never_will() {
    let (_redis, pg, a, b) = setup();
    let writes: Vec<(i32, String)> = (0..60).map(|i| (i, nonce())).collect();
    let answered = a.client.block_on(async {
        let sends = writes.iter().map(|(id, n)| {
            // Statements of 0 to 380 ms, and commits of 0 or 300 ms: the freeze at 150 ms
            // finds some answered, some running, some committing.
            let body = json!({"sql": "INSERT INTO outcome_t (id) SELECT $1 FROM pg_sleep($2)",
                              "params": [id, f64::from(id % 20) * 0.02]});
            let c = a.client.clone();
            async move { write_with(&c, &body, n, Duration::from_secs(3)).await }
        });
        let freeze = async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            ferry_testkit::signal(a.pid(), "STOP");
        };
        futures::future::join(futures::future::join_all(sends), freeze)
            .await
            .0
    });
    let mut ok = BTreeSet::new();
    let (mut committed, mut not_committed) = (BTreeSet::new(), BTreeSet::new());
    for ((id, n), got) in writes.iter().zip(&answered) {
        match got {
            Some((200, _)) => {
                ok.insert(*id);
            }
            Some((status, body)) => panic!("write {id}: {status} {body:?}"),
            None => {
                let o = outcome(&b.client, n);
                if o["committed"] == true {
                    assert_eq!(o["rows_affected"], 1, "{o:?}");
                    committed.insert(*id);
                } else {
                    not_committed.insert(*id);
                }
            }
        }
    }
    // Let the frozen sidecar go: it tries to commit every write it held.
    ferry_testkit::signal(a.pid(), "CONT");
    std::thread::sleep(Duration::from_secs(2));
    let there = rows(&pg);
    eprintln!(
        "FIGURES answered {} · unanswered: committed {} / not committed {} · rows {}",
        ok.len(),
        committed.len(),
        not_committed.len(),
        there.len()
    );
    assert!(
        !not_committed.is_empty(),
        "the freeze caught no write running"
    );
    assert!(
        !committed.is_empty(),
        "the freeze caught no write committing"
    );
    let expected: BTreeSet<i32> = ok.union(&committed).copied().collect();
    assert_eq!(
        there, expected,
        "rows differ from what callers were told (not committed: {not_committed:?})"
    );
}

#[test]
fn an_outcome_is_final_and_a_fenced_write_never_runs() {
    let (_redis, pg, a, b) = setup();
    let c = &a.client;
    // A committed write: its outcome says so, with its rows, from any sidecar.
    let n = nonce();
    let body = json!({"sql": "INSERT INTO outcome_t (id) VALUES (1)"});
    let got = c.block_on(write_with(c, &body, &n, Duration::from_secs(5)));
    assert_eq!(got.map(|g| g.0), Some(200));
    let o = outcome(&b.client, &n);
    assert_eq!(
        (o["committed"].clone(), o["rows_affected"].clone()),
        (json!(true), json!(1))
    );

    // A write never sent: not committed, and once asked, it never can be.
    let n = nonce();
    assert_eq!(outcome(&b.client, &n)["committed"], false);
    let body = json!({"sql": "INSERT INTO outcome_t (id) VALUES (2)"});
    let late = c.block_on(write_with(c, &body, &n, Duration::from_secs(5)));
    let (status, err) = late.expect("answered");
    assert_eq!(
        (status, err["error"]["code"].clone()),
        (401, json!("auth_replayed"))
    );
    assert_eq!(outcome(&b.client, &n)["committed"], false, "still final");

    // A write that failed: not committed, and refused if sent again.
    let n = nonce();
    let body = json!({"sql": "INSERT INTO outcome_t (id) VALUES (1)"});
    let dup = c.block_on(write_with(c, &body, &n, Duration::from_secs(5)));
    assert_eq!(
        dup.map(|d| d.0),
        Some(400),
        "a duplicate key is the caller's error"
    );
    assert_eq!(outcome(&b.client, &n)["committed"], false);
    assert_eq!(rows(&pg), BTreeSet::from([1]));

    // Bad input: a clear 400 naming the field.
    for bad in [json!({"nonce": "xyz"}), json!({"nonce": 5}), json!({})] {
        let r = b.client.block_on(b.client.post("/v1/outcome", &bad));
        assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
    }
}

/// An interactive transaction's COMMIT is a write like any other: asked by the nonce its
/// commit request was signed with, `/v1/outcome` tells the truth (it committed), from another
/// sidecar. Asked of a rolled-back one, it says not committed, and the rows agree.
#[test]
fn an_interactive_commit_has_an_outcome() {
    let (_redis, pg, a, b) = setup();
    let c = &a.client;
    let run = |commit: bool, id: i32| {
        let begun = c.block_on(c.post("/v1/transaction/begin", &json!({})));
        assert_eq!(begun.status, 200, "{:?}", begun.body);
        let tx = begun.body["id"].clone();
        let sql = format!("INSERT INTO outcome_t (id) VALUES ({id})");
        let q = c.block_on(c.post("/v1/transaction/query", &json!({"id": tx, "sql": sql})));
        assert_eq!(q.status, 200, "{:?}", q.body);
        let n = nonce();
        let path = if commit {
            "/v1/transaction/commit"
        } else {
            "/v1/transaction/rollback"
        };
        let ended = c.block_on(post_with(
            c,
            path,
            &json!({"id": tx}),
            &n,
            Duration::from_secs(5),
        ));
        assert_eq!(ended.map(|e| e.0), Some(200));
        n
    };
    let committed = run(true, 21);
    assert_eq!(rows(&pg), BTreeSet::from([21]));
    let o = outcome(&b.client, &committed);
    assert_eq!(
        (o["committed"].clone(), o["rows_affected"].clone()),
        (json!(true), json!(1)),
        "a committed transaction said not committed: {o}"
    );
    assert_eq!(
        outcome(&b.client, &committed)["committed"],
        true,
        "and it stays so"
    );
    let rolled_back = run(false, 23);
    assert_eq!(outcome(&b.client, &rolled_back)["committed"], false);
    assert_eq!(rows(&pg), BTreeSet::from([21]));
}

/// A write runs in a transaction of its own (so its nonce row commits with it). When the
/// parameter types remembered from an earlier run do not fit (a bad value, or a changed
/// column), the failed try aborted that transaction: it is begun again before the retry, so
/// the caller gets Postgres's own error, not "current transaction is aborted".
#[test]
fn a_failed_fast_try_starts_the_write_over() {
    let (_redis, pg, a, _b) = setup();
    let c = &a.client;
    let write = |price: Value| {
        c.execute(json!({"sql": "UPDATE items SET price = $1 WHERE id = 3", "params": [price]}))
    };
    assert_eq!(write(json!("2.50")).status, 200, "types remembered");
    let bad = write(json!("not a number"));
    assert_eq!(bad.status, 400, "{:?}", bad.body);
    assert_eq!(bad.body["error"]["pg_code"], "22P02", "{:?}", bad.body);
    // A column changed under remembered types: the retry runs it as it is now.
    pg.client()
        .batch_execute("ALTER TABLE items ALTER COLUMN price TYPE text")
        .expect("alter");
    let after = write(json!("3.75"));
    assert_eq!(after.status, 200, "{:?}", after.body);
    let price: String = pg
        .client()
        .query_one("SELECT price FROM items WHERE id = 3", &[])
        .expect("row")
        .get(0);
    assert_eq!(price, "3.75");
}

/// A nonce table made by an earlier version (no `rows_affected`) is brought up to date by the
/// first write, by Ferry's own role (it owns the table), instead of failing every write.
#[test]
fn an_old_nonce_table_gets_its_outcome_column() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "CREATE TABLE ferry.nonces (nonce bytea PRIMARY KEY, expires_at timestamptz NOT NULL);
             ALTER TABLE ferry.nonces OWNER TO ferry_owner;",
        )
        .expect("old table");
    let url = pg.url_as("ferry_app");
    let s = SidecarProcess::start(BIN, &redis.url(), &url, &[], Stdio::null());
    let w = s
        .client
        .execute(json!({"sql": "UPDATE items SET name = 'new' WHERE id = 5"}));
    assert_eq!(w.status, 200, "{:?}", w.body);
    let rows: Option<i64> = pg
        .client()
        .query_one("SELECT max(rows_affected) FROM ferry.nonces", &[])
        .expect("column")
        .get(0);
    assert_eq!(rows, Some(1));
}

/// The same old table owned by someone else, so that Ferry's role may not add the column:
/// writes are refused as the server's fault, and nothing of Ferry's table reaches the caller.
#[test]
fn an_old_nonce_table_the_role_cannot_alter_is_not_the_callers_error() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "CREATE TABLE ferry.nonces (nonce bytea PRIMARY KEY, expires_at timestamptz NOT NULL);
             GRANT SELECT, INSERT, DELETE ON ferry.nonces TO ferry_owner;",
        )
        .expect("old table");
    let url = pg.url_as("ferry_app");
    let s = SidecarProcess::start(BIN, &redis.url(), &url, &[], Stdio::null());
    let w = s
        .client
        .execute(json!({"sql": "UPDATE items SET name = 'new' WHERE id = 5"}));
    assert_eq!(w.status, 500, "{:?}", w.body);
    assert_eq!(w.body["error"]["code"], "internal", "{:?}", w.body);
    assert!(!w.body.to_string().contains("nonces"), "{:?}", w.body);
    let name: String = pg
        .client()
        .query_one("SELECT name FROM items WHERE id = 5", &[])
        .expect("row")
        .get(0);
    assert_eq!(name, "item 5", "nothing was written");
}

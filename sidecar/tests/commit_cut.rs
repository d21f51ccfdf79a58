//! The connection to Postgres cut while a write's COMMIT runs (a deferred trigger makes the
//! COMMIT take a second; a proxy between the sidecar binary and Postgres drops every
//! connection in the middle of it). Postgres finishes the COMMIT anyway, so the write is
//! answered as the success it is: the sidecar asks the write's outcome on a new connection
//! before answering. When Postgres cannot be reached for that either, the answer says the
//! outcome is unknown (never a plain failure), and `POST /v1/outcome` later gives it. The rows
//! judge.
use ferry_testkit::{wait_until, CutProxy, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

/// Postgres with a table whose every COMMIT takes `commit_ms`, and a sidecar reaching it
/// through a proxy the test cuts.
fn setup(commit_ms: u64) -> (RedisServer, PgServer, CutProxy, SidecarProcess) {
    setup_with(commit_ms, &[])
}

/// [`setup`], with more of the sidecar's environment.
fn setup_with(
    commit_ms: u64,
    env: &[(&str, &str)],
) -> (RedisServer, PgServer, CutProxy, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.client()
        .batch_execute(&format!(
            "CREATE TABLE notes (id serial PRIMARY KEY, body text NOT NULL);
             CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep({commit_ms} / 1000.0); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON notes
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();"
        ))
        .expect("create the table");
    let proxy = CutProxy::start(([127, 0, 0, 1], pg.port).into());
    let url = pg.url().replace(
        &format!(":{}/", pg.port),
        &format!(":{}/", proxy.addr.port()),
    );
    assert_ne!(url, pg.url(), "the sidecar must go through the proxy");
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &url,
        &[&[("FERRY_POSTGRES_CHECKOUT_TIMEOUT_MS", "1000")], env].concat(),
        Stdio::null(),
    );
    (redis, pg, proxy, s)
}

/// The rows with `body`, once no statement of the sidecar's is still running (a COMMIT cut off
/// from the sidecar finishes on its own time, whatever the sidecar answered meanwhile).
fn notes(pg: &PgServer, body: &str) -> i64 {
    let mut psql = pg.client();
    wait_until(
        "the sidecar's statements to end",
        Duration::from_secs(10),
        || {
            let running: i64 = psql
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'ferry-sidecar' AND state = 'active'",
                    &[],
                )
                .expect("pg_stat_activity")
                .get(0);
            running == 0
        },
    );
    psql.query_one("SELECT count(*) FROM notes WHERE body = $1", &[&body])
        .expect("count")
        .get(0)
}

/// Sends the write, cuts the proxy 500 ms into it (during its COMMIT), heals it
/// `heal_after_ms` later; returns the write's answer.
fn cut_during_commit(
    s: &SidecarProcess,
    proxy: &CutProxy,
    body: &str,
    heal_after_ms: u64,
) -> ferry_testkit::client::Answer {
    break_during_commit(s, body, || {
        proxy.cut();
        std::thread::sleep(Duration::from_millis(heal_after_ms));
        proxy.heal();
    })
}

/// Sends the write, and runs `break_it` 500 ms into it (during its COMMIT).
fn break_during_commit(
    s: &SidecarProcess,
    body: &str,
    break_it: impl FnOnce() + Send,
) -> ferry_testkit::client::Answer {
    let write = json!({"sql": "INSERT INTO notes (body) VALUES ($1)", "params": [body]});
    break_during(s, "/v1/execute", write, break_it)
}

/// Sends `body` to `path`, and runs `break_it` 500 ms into it.
fn break_during(
    s: &SidecarProcess,
    path: &str,
    body: serde_json::Value,
    break_it: impl FnOnce() + Send,
) -> ferry_testkit::client::Answer {
    s.client.block_on(async {
        let sent = s.client.post(path, &body);
        let cut = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            tokio::task::block_in_place(break_it);
        };
        futures::future::join(sent, cut).await.0
    })
}

#[test]
fn a_write_whose_commit_loses_its_connection_is_answered_by_its_outcome() {
    let (_redis, pg, proxy, s) = setup(1_000);
    // Healed soon: the sidecar's outcome query reaches Postgres on a new connection.
    let a = cut_during_commit(&s, &proxy, "cut-then-healed", 200);
    assert_eq!(
        notes(&pg, "cut-then-healed"),
        1,
        "Postgres finished the COMMIT"
    );
    assert_eq!(
        (a.status, a.body["rows_affected"].as_u64()),
        (200, Some(1)),
        "a committed write answered as a failure: {}",
        a.body
    );
}

/// The network in between resets the connection instead (a TCP RST, no orderly close): the
/// driver reports an I/O error ("connection reset"), which is the same lost session.
#[test]
fn a_write_whose_commit_connection_is_reset_is_answered_by_its_outcome() {
    let (_redis, pg, proxy, s) = setup(1_000);
    let a = break_during_commit(&s, "reset-mid-commit", || proxy.reset());
    assert_eq!(
        notes(&pg, "reset-mid-commit"),
        1,
        "Postgres finished the COMMIT"
    );
    assert_eq!(
        (a.status, a.body["rows_affected"].as_u64()),
        (200, Some(1)),
        "a committed write answered as a failure: {}",
        a.body
    );
}

/// Postgres ends the write's session during its COMMIT (`pg_terminate_backend`: 57P01 and a
/// close). The COMMIT did not happen, and the answer says so: a plain 503
/// `database_unavailable` after the outcome was asked, never a 200 and never `outcome_unknown`
/// with Postgres up. The same write sent again then commits once.
#[test]
fn a_write_whose_session_is_terminated_during_its_commit_is_answered_as_not_committed() {
    let (_redis, pg, _proxy, s) = setup(1_000);
    let a = break_during_commit(&s, "terminated-mid-commit", || {
        let ended: Vec<i32> = pg
            .client()
            .query(
                "WITH s AS MATERIALIZED (SELECT pid FROM pg_stat_activity
                                         WHERE application_name = 'ferry-sidecar'
                                           AND state = 'active')
                 SELECT pid FROM s WHERE pg_terminate_backend(pid)",
                &[],
            )
            .expect("terminate")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(ended.len(), 1, "the write's session, mid-COMMIT");
    });
    assert_eq!(
        notes(&pg, "terminated-mid-commit"),
        0,
        "Postgres ended the transaction"
    );
    assert_eq!(
        (a.status, a.code()),
        (503, "database_unavailable"),
        "a write that did not commit: {}",
        a.body
    );
    let again = s.client.execute(
        json!({"sql": "INSERT INTO notes (body) VALUES ($1)", "params": ["terminated-mid-commit"]}),
    );
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(notes(&pg, "terminated-mid-commit"), 1);
}

/// An interactive transaction's COMMIT cut off the same way: its commit request's nonce row
/// went with the COMMIT, so it is answered by its outcome too (it committed), not left unknown.
#[test]
fn an_interactive_commit_cut_off_is_answered_by_its_outcome() {
    let (_redis, pg, proxy, s) = setup(1_000);
    let begun = s
        .client
        .block_on(s.client.post("/v1/transaction/begin", &json!({})));
    assert_eq!(begun.status, 200, "{}", begun.body);
    let id = begun.body["id"].clone();
    let inserted = s.client.block_on(s.client.post(
        "/v1/transaction/query",
        &json!({"id": id, "sql": "INSERT INTO notes (body) VALUES ('interactive-cut')"}),
    ));
    assert_eq!(inserted.status, 200, "{}", inserted.body);
    let a = break_during(&s, "/v1/transaction/commit", json!({"id": id}), || {
        proxy.cut();
        std::thread::sleep(Duration::from_millis(200));
        proxy.heal();
    });
    assert_eq!(
        notes(&pg, "interactive-cut"),
        1,
        "Postgres finished the COMMIT"
    );
    assert_eq!(
        (a.status, a.body["committed"].clone()),
        (200, json!(true)),
        "a committed transaction answered as a failure: {}",
        a.body
    );
}

/// Where no outcome is kept for a write (`auth.replay = "local"`), a connection lost during its
/// COMMIT leaves it unknown, and the answer says so: 503 `outcome_unknown`, never
/// `database_unavailable`, which a caller reads as "it did not happen" and retries.
#[test]
fn a_write_with_replay_local_cut_during_its_commit_is_answered_as_unknown() {
    let (_redis, pg, proxy, s) = setup_with(1_000, &[("FERRY_AUTH_REPLAY", "local")]);
    let a = cut_during_commit(&s, &proxy, "local-cut", 200);
    assert_eq!(notes(&pg, "local-cut"), 1, "Postgres finished the COMMIT");
    assert_eq!(
        (a.status, a.code()),
        (503, "outcome_unknown"),
        "a commit that may have happened: {}",
        a.body
    );
    let t = s.client.block_on(s.client.post(
        "/v1/transaction",
        &json!({"statements": [{"sql": "INSERT INTO notes (body) VALUES ('local-tx-cut')"}]}),
    ));
    assert_eq!(t.status, 200, "{}", t.body);
    let a = break_during(
        &s,
        "/v1/transaction",
        json!({"statements": [{"sql": "INSERT INTO notes (body) VALUES ('local-tx-cut-2')"}]}),
        || {
            proxy.cut();
            std::thread::sleep(Duration::from_millis(200));
            proxy.heal();
        },
    );
    assert_eq!(
        notes(&pg, "local-tx-cut-2"),
        1,
        "Postgres finished the COMMIT"
    );
    assert_eq!(
        (a.status, a.code()),
        (503, "outcome_unknown"),
        "a transaction that may have committed: {}",
        a.body
    );
}

#[test]
fn a_commit_whose_outcome_cannot_be_asked_is_answered_as_unknown_then_resolved() {
    let (_redis, pg, proxy, s) = setup(1_000);
    // Healed only after the sidecar gave up asking (its checkout timeout is 1 s).
    let write_body = "cut-for-long";
    let write = json!({"sql": "INSERT INTO notes (body) VALUES ($1)", "params": [write_body]});
    let bytes = serde_json::to_vec(&write).expect("json");
    let nonce = ferry_testkit::client::nonce();
    let h = s.client.headers_for(
        "POST",
        "/v1/execute",
        &bytes,
        ferry_testkit::client::now_s(),
        &nonce,
    );
    let a = s.client.block_on(async {
        let sent = s.client.send_raw("POST", "/v1/execute", bytes.clone(), &h);
        let cut = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            proxy.cut();
            tokio::time::sleep(Duration::from_millis(4_000)).await;
            proxy.heal();
        };
        futures::future::join(sent, cut).await.0
    });
    assert_eq!(notes(&pg, write_body), 1, "Postgres finished the COMMIT");
    assert_eq!(
        (a.status, a.code()),
        (503, "outcome_unknown"),
        "a committed write must not be answered as a plain failure: {}",
        a.body
    );
    // Once Postgres is reachable again, the outcome says what happened.
    let o = s
        .client
        .block_on(s.client.post("/v1/outcome", &json!({"nonce": nonce})));
    assert_eq!(o.status, 200, "{}", o.body);
    assert_eq!(o.body["committed"], true, "{}", o.body);
}

/// Promise 1 across sidecars through a reset mid-COMMIT: a second sidecar (straight to
/// Postgres, the same Redis) has the count cached; a write and an interactive transaction,
/// each reset during its COMMIT on the first sidecar and answered 200 by its outcome, invalidate
/// it; the second sidecar then never answers the count from before the write.
#[test]
fn a_write_answered_by_its_outcome_is_read_back_fresh_from_another_sidecar() {
    let (redis, pg, proxy, a) = setup(1_000);
    let b = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let count = || {
        let r = b.client.query(json!({
            "sql": "SELECT count(*)::int AS n FROM notes WHERE body LIKE 'fresh-%'",
            "cache": {"ttl_s": 300, "key": "notes:fresh"}
        }));
        assert_eq!(r.status, 200, "{}", r.body);
        (r.body["rows"][0]["n"].as_i64(), r.body["cache"].clone())
    };
    let invalidate = json!({"keys": ["notes:fresh"]});
    assert_eq!(count().0, Some(0));
    assert_eq!(
        count(),
        (Some(0), json!("hit")),
        "cached on the second sidecar"
    );
    let write = json!({"sql": "INSERT INTO notes (body) VALUES ('fresh-1')",
                       "invalidate": invalidate});
    let w = break_during(&a, "/v1/execute", write, || proxy.reset());
    assert_eq!(w.status, 200, "{}", w.body);
    assert_eq!(notes(&pg, "fresh-1"), 1);
    assert_eq!(
        count().0,
        Some(1),
        "the pre-write count after an acknowledged write"
    );

    let begun = a
        .client
        .block_on(a.client.post("/v1/transaction/begin", &json!({})));
    let id = begun.body["id"].clone();
    let q = a.client.block_on(a.client.post(
        "/v1/transaction/query",
        &json!({"id": id, "sql": "INSERT INTO notes (body) VALUES ('fresh-2')"}),
    ));
    assert_eq!(q.status, 200, "{}", q.body);
    assert_eq!(count(), (Some(1), json!("hit")), "cached again");
    let end = json!({"id": id, "invalidate": invalidate});
    let c = break_during(&a, "/v1/transaction/commit", end, || proxy.reset());
    assert_eq!(
        (c.status, c.body["committed"].clone()),
        (200, json!(true)),
        "{}",
        c.body
    );
    assert_eq!(notes(&pg, "fresh-2"), 1);
    assert_eq!(
        count().0,
        Some(2),
        "the pre-commit count after an acknowledged commit"
    );
}

/// Neon's `/sql` is not signed, so no nonce and no outcome is kept for its writes: a write
/// statement (its own transaction) and a batch (one transaction), each cut off during its
/// COMMIT, committed, and must be answered as possibly committed (503 `outcome_unknown`),
/// never as Postgres being unavailable, which a caller reads as "not done" and retries.
#[test]
fn a_neon_sql_write_cut_during_its_commit_is_answered_as_unknown() {
    const TOKEN: &str = "commit-cut-neon-token-0123456789abcdef0123";
    let env = [("FERRY_NEON_ENABLED", "true"), ("FERRY_NEON_TOKEN", TOKEN)];
    let (_redis, pg, proxy, s) = setup_with(1_000, &env);
    let insert =
        |body: &str| json!({"query": "INSERT INTO notes (body) VALUES ($1)", "params": [body]});
    for (body, request) in [
        ("neon-single", insert("neon-single")),
        ("neon-batch", json!({"queries": [insert("neon-batch")]})),
    ] {
        let url = format!("http://127.0.0.1:{}/sql", s.port);
        let (status, answer) = s.client.block_on(async {
            let sent = async {
                let r = reqwest::Client::new()
                    .post(url)
                    .header(
                        "Neon-Connection-String",
                        format!("postgresql://app:{TOKEN}@db.ferry.invalid/app"),
                    )
                    .body(request.to_string())
                    .send()
                    .await
                    .expect("send /sql");
                let status = r.status().as_u16();
                (
                    status,
                    r.json::<serde_json::Value>().await.unwrap_or_default(),
                )
            };
            let cut = async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                tokio::task::block_in_place(|| {
                    proxy.cut();
                    std::thread::sleep(Duration::from_millis(200));
                    proxy.heal();
                });
            };
            futures::future::join(sent, cut).await.0
        });
        assert_eq!(notes(&pg, body), 1, "{body}: Postgres finished the COMMIT");
        assert_eq!(
            (status, answer["code"].as_str()),
            (503, Some("outcome_unknown")),
            "{body}: a write that committed: {answer}"
        );
    }
}

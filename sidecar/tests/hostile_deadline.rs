//! A deadline ends the work, not just the answer. A caller lifts its own `statement_timeout`
//! (`set_config(..., true)` in a batch or a transaction) and then sleeps, on every path that
//! runs SQL: a Neon batch (the workers' own sessions), a `/v1/transaction` (the blocking pool)
//! and an interactive transaction. Postgres's own view judges: the sidecar's backends in
//! `pg_stat_activity` never outnumber its pool, none is still running once the answers are
//! in, and a row lock taken by such a request is free once it was answered.
use ferry_testkit::doors::config_file;
use ferry_testkit::{wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "neon-deadline-token-0123456789abcdefghijk";
const POOL: i64 = 6;
/// The token's role: one session per worker, two workers.
const TOKEN_SESSIONS: i64 = 2;

const LIFT: &str = "SELECT set_config('statement_timeout', '0', true)";
const SLEEP: &str = "SELECT 1 AS n FROM pg_sleep(30)";

fn start(redis: &RedisServer, pg: &PgServer, file: &tempfile::NamedTempFile) -> SidecarProcess {
    SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url_as("ferry_app"),
        &[
            ("FERRY_CONFIG", file.path().to_str().expect("utf-8 path")),
            ("FERRY_POSTGRES_POOL_SIZE", "6"),
            ("FERRY_SERVER_REQUEST_TIMEOUT_MS", "1500"),
            ("FERRY_POSTGRES_STATEMENT_TIMEOUT_MS", "1000"),
            ("FERRY_POSTGRES_CHECKOUT_TIMEOUT_MS", "300"),
        ],
        Stdio::null(),
    )
}

/// The sidecar's backends: (all, running a statement).
fn backends(pg: &PgServer) -> (i64, i64) {
    let row = pg
        .client()
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity \
             WHERE application_name = 'ferry-sidecar' AND usename <> 'ferry_owner'",
            &[],
        )
        .expect("pg_stat_activity");
    (row.get(0), row.get(1))
}

/// Sends `wave` (each a request of its own, all at once) while sampling the backends; returns
/// the most seen at once of the requests' role and of the token's.
fn attack(s: &SidecarProcess, pg: &PgServer, wave: &[(&'static str, Value)]) -> [i64; 2] {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, url) = (done.clone(), pg.url());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("judge");
            let mut most = [0i64; 2];
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let row = c
                    .query_one(
                        "SELECT count(*) FILTER (WHERE usename = 'ferry_app'), \
                                count(*) FILTER (WHERE usename = 'ferry_neon') \
                         FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'",
                        &[],
                    )
                    .expect("pg_stat_activity");
                most = [most[0].max(row.get(0)), most[1].max(row.get(1))];
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let answers = s.client.block_on(futures::future::join_all(wave.iter().map(
        |(door, body)| {
            let c = s.client.clone();
            let body = body.clone();
            async move {
                match *door {
                    "neon" => c.neon_async(TOKEN, body, &[]).await,
                    path => c.post(path, &body).await,
                }
            }
        },
    )));
    for a in &answers {
        assert!(
            matches!(a.status, 503 | 504),
            "an endless statement was answered {}: {}",
            a.status,
            a.body
        );
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    sampler.join().expect("sampler")
}

#[test]
fn abandoned_statements_end_with_their_deadline_and_never_pass_the_pool() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let file = config_file(&format!(
        "[neon]\nenabled = true\n[[neon.tokens]]\ntoken = \"{TOKEN}\"\npostgres_url = \"{}\"\n",
        pg.url_as("ferry_neon")
    ));
    let s = start(&redis, &pg, &file);
    let neon = json!({ "queries": [{ "query": LIFT }, { "query": SLEEP }] });
    let tx = json!({ "statements": [{ "sql": LIFT }, { "sql": SLEEP }] });
    let wave: Vec<(&str, Value)> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                ("neon", neon.clone())
            } else {
                ("/v1/transaction", tx.clone())
            }
        })
        .collect();
    for round in 0..4 {
        let [requests, token] = attack(&s, &pg, &wave);
        assert!(
            requests <= POOL,
            "round {round}: {requests} backends of the requests' role at once, pool {POOL}"
        );
        assert!(
            token <= TOKEN_SESSIONS,
            "round {round}: {token} backends of the token's role, bound {TOKEN_SESSIONS}"
        );
        wait_until(
            "the abandoned statements to end",
            Duration::from_secs(3),
            || backends(&pg).1 == 0,
        );
    }
    // The sidecar still serves, at once.
    let ok = s
        .client
        .query(json!({ "sql": "SELECT name FROM items WHERE id = 1" }));
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[test]
fn a_row_lock_taken_by_an_expired_request_is_free_once_it_is_answered() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let file = config_file(&format!(
        "[neon]\nenabled = true\n[[neon.tokens]]\ntoken = \"{TOKEN}\"\npostgres_url = \"{}\"\n",
        pg.url_as("ferry_neon")
    ));
    let s = start(&redis, &pg, &file);
    let lock = "SELECT id FROM items WHERE id = 5 FOR UPDATE";
    // The one-shot transaction (blocking pool), then an interactive one.
    let tx = s.client.block_on(s.client.post(
        "/v1/transaction",
        &json!({ "statements": [{ "sql": LIFT }, { "sql": lock }, { "sql": SLEEP }] }),
    ));
    assert_eq!(tx.status, 504, "{}", tx.body);
    assert_unlocked(&pg, "/v1/transaction");

    let begin = s
        .client
        .block_on(s.client.post("/v1/transaction/begin", &json!({})));
    assert_eq!(begin.status, 200, "{}", begin.body);
    let id = begin.body["id"].as_str().expect("an id").to_string();
    for sql in [LIFT, lock] {
        let r = s.client.block_on(
            s.client
                .post("/v1/transaction/query", &json!({ "id": id, "sql": sql })),
        );
        assert_eq!(r.status, 200, "{sql}: {}", r.body);
    }
    let slept = s.client.block_on(
        s.client
            .post("/v1/transaction/query", &json!({ "id": id, "sql": SLEEP })),
    );
    assert_eq!(slept.status, 504, "{}", slept.body);
    assert_unlocked(&pg, "an interactive transaction");
    // That transaction is gone with its statement.
    let after = s.client.block_on(s.client.post(
        "/v1/transaction/query",
        &json!({ "id": id, "sql": "SELECT 1" }),
    ));
    assert_eq!(after.status, 404, "{}", after.body);
}

/// Another writer takes the row within a second of the answer (its own lock_timeout judges).
fn assert_unlocked(pg: &PgServer, what: &str) {
    let started = Instant::now();
    let mut c = pg.client();
    c.batch_execute("SET lock_timeout = '1s'")
        .expect("lock_timeout");
    let got = c.execute("UPDATE items SET name = 'taken' WHERE id = 5", &[]);
    assert!(
        got.is_ok(),
        "{what}: the row was still locked {:?} after the answer: {got:?}",
        started.elapsed()
    );
}

//! Every kind of request, right after every session the sidecar held was ended: by Postgres
//! (an operator's `pg_terminate_backend`, `idle_session_timeout`), or by the network in between
//! (a NAT, load balancer or pooler dropping its connections with a TCP RST, so the sidecar's
//! next write or read fails with "connection reset", not an orderly end). Postgres is up, so
//! each must succeed. A session ended is found lost on its next statement; a read runs again on
//! another session, a write that had sent nothing takes another, whatever the route or protocol: `/v1/query` (named, with and without the reset, and
//! raw), `/v1/execute`, `/v1/transaction`, an interactive transaction, `/v1/batch/keyed` and
//! Neon's `/sql`. Postgres's rows judge the writes.
use ferry_testkit::{wait_until, CutProxy, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "sessions-killed-token-0123456789abcdef0123";

/// A request of one kind, for round `n`: its status and body.
type Route<'a> = Box<dyn Fn(i64) -> (u16, Value) + 'a>;

/// Every kind of request (Neon's `/sql` where the workers have sessions of their own: it runs
/// on them).
fn routes(s: &SidecarProcess, neon: bool) -> Vec<(&'static str, Route<'_>)> {
    let c = &s.client;
    let post = move |path: &str, body: Value| {
        let a = c.block_on(c.post(path, &body));
        (a.status, a.body)
    };
    let answer = |a: ferry_testkit::client::Answer| (a.status, a.body);
    let mut all: Vec<(&'static str, Route<'_>)> = vec![
        (
            "named read, skip_reset",
            Box::new(move |n| {
                answer(
                    c.query(json!({"query": "item", "params": [n], "cache": {"mode": "no-cache"}})),
                )
            }),
        ),
        (
            "raw read",
            Box::new(move |n| {
                answer(c.query(json!({"sql": "SELECT count(*)::int AS n FROM items WHERE id <= $1", "params": [n]})))
            }),
        ),
        (
            "named write",
            Box::new(move |n| {
                answer(c.execute(
                    json!({"query": "upsert_item", "params": [9000 + n, format!("w{n}"), "1.00"]}),
                ))
            }),
        ),
        (
            "transaction",
            Box::new(move |n| {
                post(
                    "/v1/transaction",
                    json!({"statements": [{"sql": "UPDATE items SET price = price + 1 WHERE id = $1", "params": [n]}]}),
                )
            }),
        ),
        (
            "interactive transaction",
            Box::new(move |_| {
                let (status, begun) = post("/v1/transaction/begin", json!({}));
                if status != 200 {
                    return (status, begun);
                }
                post("/v1/transaction/commit", json!({"id": begun["id"]}))
            }),
        ),
        (
            "keyed batch",
            Box::new(move |n| {
                post(
                    "/v1/batch/keyed",
                    json!({"keyspace": "items", "ids": [100 + n]}),
                )
            }),
        ),
    ];
    if neon {
        let url = format!("http://127.0.0.1:{}/sql", s.port);
        all.push((
            "neon /sql",
            Box::new(move |n| {
                let url = url.clone();
                c.block_on(async move {
                    let r = reqwest::Client::new()
                        .post(url)
                        .header(
                            "Neon-Connection-String",
                            format!("postgresql://app:{TOKEN}@db.ferry.invalid/app"),
                        )
                        .body(json!({"query": "SELECT name FROM items WHERE id = $1", "params": [n.to_string()]}).to_string())
                        .send()
                        .await
                        .expect("send /sql");
                    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
                })
            }),
        ));
    }
    all
}

/// How every session is ended.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `pg_terminate_backend`: Postgres says so (57P01) and closes.
    Terminated,
    /// The proxy in between aborts each connection with a TCP RST.
    Reset,
}

/// Both workers' event-loop sessions (one each) and two pooled ones.
#[test]
fn every_route_succeeds_right_after_its_sessions_are_killed() {
    killed_under_every_route("4", true, Ending::Terminated);
}

/// Every session pooled (a pool of two leaves the workers none): a read that draws a lost
/// session may draw the other lost one next.
#[test]
fn every_route_succeeds_right_after_its_pooled_sessions_are_killed() {
    killed_under_every_route("2", false, Ending::Terminated);
}

/// The same, with the network in between resetting every connection (both pool shapes).
#[test]
fn every_route_succeeds_right_after_the_network_resets_its_sessions() {
    killed_under_every_route("4", true, Ending::Reset);
    killed_under_every_route("2", false, Ending::Reset);
}

fn killed_under_every_route(pool: &str, neon: bool, ending: Ending) {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], pg.port)));
    let pg_url = match ending {
        Ending::Terminated => pg.url(),
        Ending::Reset => format!("postgres://postgres@{}/postgres", proxy.addr),
    };
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg_url,
        &[
            ("FERRY_CONFIG", config),
            ("FERRY_POSTGRES_POOL_SIZE", pool),
            ("FERRY_SERVER_WORKERS", "2"),
            ("FERRY_AUTH_ALLOW_RAW_SQL", "true"),
            ("FERRY_NEON_ENABLED", if neon { "true" } else { "false" }),
            ("FERRY_NEON_TOKEN", TOKEN),
        ],
        Stdio::null(),
    );
    let psql = &mut pg.client();
    let sessions = |psql: &mut postgres::Client| -> i64 {
        psql.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'",
            &[],
        )
        .expect("pg_stat_activity")
        .get(0)
    };
    let routes = routes(&s, neon);
    let mut failed = Vec::new();
    for n in 1..=4i64 {
        for (what, run) in &routes {
            // A session open where this kind of request takes it from, then every one ended.
            // (Also right after the previous kind's ending: other sessions may still be dead.)
            let (status, body) = run(10 * n);
            if status != 200 {
                failed.push(format!("round {n}, warming {what}: {status} {body}"));
            }
            let killed: Vec<i32> = match ending {
                Ending::Terminated => psql.query(
                    "WITH s AS MATERIALIZED (SELECT pid FROM pg_stat_activity
                                             WHERE application_name = 'ferry-sidecar')
                     SELECT pid FROM s WHERE pg_terminate_backend(pid)",
                    &[],
                ),
                Ending::Reset => psql.query(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'",
                    &[],
                ),
            }
            .expect("the sidecar's sessions")
            .iter()
            .map(|r| r.get(0))
            .collect();
            if let Ending::Reset = ending {
                proxy.reset();
            }
            if killed.is_empty() {
                // Only after a failed warming request (its session closed, none opened since).
                failed.push(format!("round {n}, {what}: no session to end"));
                continue;
            }
            // Gone from Postgres (the sidecar's readiness check may open a new one meanwhile).
            wait_until("the sessions to end", Duration::from_secs(5), || {
                let left: i64 = psql
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
                        &[&killed],
                    )
                    .expect("pg_stat_activity")
                    .get(0);
                left == 0
            });
            let (status, body) = run(10 * n + 1);
            if status != 200 {
                failed.push(format!("round {n}, {what}: {status} {body}"));
            }
        }
    }
    println!(
        "FIGURES sessions ended ({ending:?}, pool of {pool}): {} requests, each right after \
         every session was ended; {} failed",
        8 * routes.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "requests failed with Postgres up: {failed:#?}"
    );
    // Every acknowledged write is in Postgres's rows.
    for n in 1..=4i64 {
        for id in [9000 + 10 * n, 9000 + 10 * n + 1] {
            let row = psql
                .query_opt("SELECT name FROM items WHERE id = $1", &[&(id as i32)])
                .expect("row");
            assert!(
                row.is_some(),
                "the acknowledged write of item {id} is missing"
            );
        }
    }
    let most: i64 = pool.parse().expect("pool");
    assert!(sessions(psql) <= most, "more sessions than the pool");
}

//! One client at 0 RTT (no latency proxy): what each path adds to a single request. webdis GET
//! vs Ferry's signed cache GET and `/v1/query` hit; a `/v1/query` miss (read-through: lookup,
//! Postgres, write-back), as raw SQL and as the operator's named query, vs the same point query on a persistent Postgres connection (simple
//! protocol, as `pgbench -S` sends it); a `/v1/execute` point UPDATE vs the same UPDATE sent
//! directly. Same load generator for all.

use super::{Measurement, Plan};
use crate::env::POINT_READ;
use crate::ferry::Ferry;
use crate::Ctx;
use serde_json::json;
use std::time::{Duration, Instant};

const SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";
const UPDATE: &str = "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = $1";

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let n = plan.samples;
    let row =
        |path: &str, samples: &[Duration]| Measurement::latency("one client", 0.0, path, samples);
    let mut out = Vec::new();

    let http = reqwest::Client::new();
    let url = format!("http://{}/GET/ferry:k:bench:tp", ctx.webdis_addr);
    out.push(row(
        "webdis GET",
        &timed(n, || async {
            let r = http.get(&url).send().await.expect("webdis");
            r.bytes().await.expect("webdis body");
        })
        .await,
    ));

    let ferry = Ferry::new(format!("http://{}", ctx.sidecar_addr), 1);
    let get = json!({"op": "get", "key": "bench:tp"});
    out.push(row(
        "Ferry signed cache GET",
        &timed(n, || async {
            ferry.post("/v1/cache", &get).await.expect("get");
        })
        .await,
    ));

    let hit = json!({"sql": SQL, "params": [7], "cache": {"ttl_s": 600}});
    // Filled until it is a hit: in the sidecar's first second the schema it saw at start (the
    // scenarios' tables made just before) can have its verdicts asked again, and a read's
    // fingerprint with them, so the first fill may be under another key.
    let mut tries = 0;
    while ferry.post("/v1/query", &hit).await.expect("fill")["cache"] != "hit" {
        tries += 1;
        assert!(tries < 100, "the hit read never became a hit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    out.push(row(
        "Ferry /v1/query hit",
        &timed(n, || async {
            let r = ferry.post("/v1/query", &hit).await.expect("hit");
            assert_eq!(r["cache"], "hit");
        })
        .await,
    ));

    let aid = std::cell::Cell::new(1);
    out.push(row(
        "Ferry /v1/query without a cache policy (Postgres only)",
        &timed(n, || {
            let body = json!({"sql": SQL, "params": [aid.get()]});
            aid.set(aid.get() % 50_000 + 1);
            let ferry = &ferry;
            async move {
                ferry.post("/v1/query", &body).await.expect("query");
            }
        })
        .await,
    ));

    // A key never read before each time: every request is a miss. As raw SQL, then as the
    // operator's named query, which Postgres finds plain: kept prepared on its session (Bind
    // and Execute only) and no session reset after it.
    let next = std::cell::Cell::new(60_000);
    let (next, ferry_ref) = (&next, &ferry);
    let misses = |statement: fn(u64) -> serde_json::Value| {
        timed(n, move || {
            let aid = next.get();
            next.set(aid + 1);
            let body = statement(aid);
            let ferry = ferry_ref;
            async move {
                let r = ferry.post("/v1/query", &body).await.expect("miss");
                assert_eq!(r["cache"], "miss", "{body}");
            }
        })
    };
    out.push(row(
        "Ferry /v1/query miss (lookup, Postgres, write-back)",
        &misses(|aid| json!({"sql": SQL, "params": [aid], "cache": {"ttl_s": 600}})).await,
    ));
    out.push(row(
        "Ferry named query miss (found plain: kept prepared, no reset)",
        &misses(|aid| json!({"query": POINT_READ, "params": [aid], "cache": {"ttl_s": 600}})).await,
    ));

    // A write: its own transaction, its nonce row committed with it (the write's outcome).
    let aid = std::cell::Cell::new(1);
    out.push(row(
        "Ferry /v1/execute (point UPDATE)",
        &timed(n, || {
            let body = json!({"sql": UPDATE, "params": [aid.get()]});
            aid.set(aid.get() % 50_000 + 1);
            let ferry = &ferry;
            async move {
                ferry.post("/v1/execute", &body).await.expect("write");
            }
        })
        .await,
    ));

    let client = super::pg_client(ctx).await;
    let aid = std::cell::Cell::new(1);
    out.push(row(
        "Postgres direct UPDATE (persistent connection, simple protocol)",
        &timed(n, || {
            let q = UPDATE.replace("$1", &aid.get().to_string());
            aid.set(aid.get() % 50_000 + 1);
            let client = &client;
            async move {
                client.simple_query(&q).await.expect("update");
            }
        })
        .await,
    ));
    let aid = std::cell::Cell::new(1);
    out.push(row(
        "Postgres direct (persistent connection, simple protocol)",
        &timed(n, || {
            let q = format!("{} ", SQL.replace("$1", &aid.get().to_string()));
            aid.set(aid.get() % 100_000 + 1);
            let client = &client;
            async move {
                client.simple_query(&q).await.expect("query");
            }
        })
        .await,
    ));
    drop(client);
    out
}

/// `n` sequential runs of `f` (after a few unmeasured ones), each timed.
async fn timed<F, Fut>(n: usize, f: F) -> Vec<Duration>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..5 {
        f().await;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        samples.push(t.elapsed());
    }
    samples
}

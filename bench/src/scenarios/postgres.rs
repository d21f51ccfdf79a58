//! Scenario 2: a point query. Direct = a fresh connection per request (connect, SCRAM auth,
//! query) across the link; Ferry uncached (pooled Postgres) and Ferry cached (Redis hit). Then
//! as hosted Postgres needs it: direct with TLS (sslmode=require, a handshake per connection),
//! Ferry uncached over HTTPS kept alive.

use super::{Measurement, Plan};
use crate::ferry::Ferry;
use crate::proxy::LatencyProxy;
use crate::Ctx;
use rand::Rng;
use serde_json::json;
use std::time::Instant;

const SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let mut out = Vec::new();
    for rtt in &plan.rtts {
        let to_pg = LatencyProxy::start(ctx.pg_addr, *rtt).await.expect("proxy");
        let to_sidecar = LatencyProxy::start(ctx.sidecar_addr, *rtt)
            .await
            .expect("proxy");
        let url = format!(
            "host=127.0.0.1 port={} user=postgres password={} dbname=postgres",
            to_pg.addr.port(),
            ctx.pg_password
        );
        ctx.step(&format!("postgres: direct, fresh connection, RTT {rtt:?}"));
        let mut direct = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let aid: i32 = rand::thread_rng().gen_range(1..=100_000);
            let t = Instant::now();
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            let task = tokio::spawn(conn);
            client.query_one(SQL, &[&aid]).await.expect("query");
            drop(client);
            let _ = task.await;
            direct.push(t.elapsed());
        }
        let ferry = Ferry::new(format!("http://{}", to_sidecar.addr), 4);
        ferry
            .post("/v1/query", &json!({"sql": "SELECT 1"}))
            .await
            .expect("warm-up");
        ctx.step(&format!("postgres: Ferry uncached, RTT {rtt:?}"));
        let mut uncached = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let aid: i32 = rand::thread_rng().gen_range(1..=100_000);
            let t = Instant::now();
            let r = ferry
                .post("/v1/query", &json!({"sql": SQL, "params": [aid]}))
                .await
                .expect("query");
            uncached.push(t.elapsed());
            assert_eq!(r["cache"], "bypass");
        }
        ctx.step(&format!(
            "postgres: direct over TLS, fresh connection, RTT {rtt:?}"
        ));
        let tls_url = format!("{url} sslmode=require");
        let mut direct_tls = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let aid: i32 = rand::thread_rng().gen_range(1..=100_000);
            let t = Instant::now();
            let (client, conn) = tokio_postgres::connect(&tls_url, ctx.tls.postgres())
                .await
                .expect("connect over TLS");
            let task = tokio::spawn(conn);
            client.query_one(SQL, &[&aid]).await.expect("query");
            drop(client);
            let _ = task.await;
            direct_tls.push(t.elapsed());
        }
        ctx.step(&format!("postgres: Ferry uncached over HTTPS, RTT {rtt:?}"));
        let (_to_https, https) = super::ferry_over_https(ctx, *rtt).await;
        https
            .post("/v1/query", &json!({"sql": "SELECT 1"}))
            .await
            .expect("warm-up");
        let mut uncached_https = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let aid: i32 = rand::thread_rng().gen_range(1..=100_000);
            let t = Instant::now();
            https
                .post("/v1/query", &json!({"sql": SQL, "params": [aid]}))
                .await
                .expect("query");
            uncached_https.push(t.elapsed());
        }
        ctx.step(&format!("postgres: Ferry cached, RTT {rtt:?}"));
        let cached_req = json!({"sql": SQL, "params": [42], "cache": {"ttl_s": 600}});
        ferry.post("/v1/query", &cached_req).await.expect("fill");
        let mut cached = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let t = Instant::now();
            let r = ferry.post("/v1/query", &cached_req).await.expect("query");
            cached.push(t.elapsed());
            assert_eq!(r["cache"], "hit");
        }
        let ms = rtt.as_secs_f64() * 1000.0;
        out.push(Measurement::latency(
            "postgres",
            ms,
            "direct (connect+auth+query)",
            &direct,
        ));
        out.push(Measurement::latency(
            "postgres",
            ms,
            "Ferry uncached (pooled)",
            &uncached,
        ));
        out.push(Measurement::latency(
            "postgres",
            ms,
            "Ferry cached (Redis hit)",
            &cached,
        ));
        out.push(Measurement::latency(
            "postgres",
            ms,
            "direct TLS (connect+TLS+auth+query)",
            &direct_tls,
        ));
        out.push(Measurement::latency(
            "postgres",
            ms,
            "Ferry uncached over HTTPS (pooled, kept-alive)",
            &uncached_https,
        ));
    }
    out
}

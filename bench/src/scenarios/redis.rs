//! Scenario 1: a cached GET. Direct = what a per-request isolate does (connect, AUTH, GET,
//! close) across the wide-area link; Ferry = kept-alive HTTP to the sidecar across the same
//! link, the sidecar holding pooled Redis connections. Then both as hosted services need them:
//! direct with a TLS handshake per connection (rediss://), Ferry over HTTPS kept alive. Last,
//! the peer: webdis (HTTP to Redis, in C, no signature) kept alive across the same link, which
//! pays the same one round trip and the same wake-ups after each idle gap as Ferry does.

use super::{Measurement, Plan};
use crate::ferry::Ferry;
use crate::proxy::LatencyProxy;
use crate::resp;
use crate::Ctx;
use serde_json::json;
use std::time::Instant;

pub const KEY: &str = "bench:key";

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let value = "v".repeat(100);
    let mut r = resp::Conn::connect(ctx.redis_addr).await.expect("redis");
    r.cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
        .await
        .expect("auth");
    r.cmd(&[b"SET", KEY.as_bytes(), value.as_bytes()])
        .await
        .expect("set");
    let direct_ferry = Ferry::new(format!("http://{}", ctx.sidecar_addr), 4);
    direct_ferry
        .post(
            "/v1/cache",
            &json!({"op": "set", "key": KEY, "value": value}),
        )
        .await
        .expect("ferry set");

    let mut out = Vec::new();
    for rtt in &plan.rtts {
        let to_redis = LatencyProxy::start(ctx.redis_addr, *rtt)
            .await
            .expect("proxy");
        let to_sidecar = LatencyProxy::start(ctx.sidecar_addr, *rtt)
            .await
            .expect("proxy");
        ctx.step(&format!("redis: direct, fresh connection, RTT {rtt:?}"));
        let mut direct = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let t = Instant::now();
            let mut c = resp::Conn::connect(to_redis.addr).await.expect("connect");
            c.cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
                .await
                .expect("auth");
            let v = c.cmd(&[b"GET", KEY.as_bytes()]).await.expect("get");
            drop(c);
            direct.push(t.elapsed());
            assert_eq!(v.len(), 100);
        }
        ctx.step(&format!(
            "redis: direct over TLS, fresh connection, RTT {rtt:?}"
        ));
        let to_redis_tls = LatencyProxy::start(ctx.redis_tls_addr, *rtt)
            .await
            .expect("proxy");
        let tls = ctx.tls.redis();
        let mut direct_tls = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let t = Instant::now();
            let mut c = resp::Conn::connect_tls(to_redis_tls.addr, &tls)
                .await
                .expect("connect over TLS");
            c.cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
                .await
                .expect("auth");
            let v = c.cmd(&[b"GET", KEY.as_bytes()]).await.expect("get");
            drop(c);
            direct_tls.push(t.elapsed());
            assert_eq!(v.len(), 100);
        }
        ctx.step(&format!("redis: Ferry over HTTPS, RTT {rtt:?}"));
        let (_to_https, https) = super::ferry_over_https(ctx, *rtt).await;
        let get = json!({"op": "get", "key": KEY});
        https.post("/v1/cache", &get).await.expect("warm-up");
        let mut via_https = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let t = Instant::now();
            let v = https.post("/v1/cache", &get).await.expect("ferry get");
            via_https.push(t.elapsed());
            assert_eq!(v["value"].as_str().map(str::len), Some(100));
        }
        ctx.step(&format!("redis: Ferry, RTT {rtt:?}"));
        let ferry = Ferry::new(format!("http://{}", to_sidecar.addr), 4);
        let get = json!({"op": "get", "key": KEY});
        ferry.post("/v1/cache", &get).await.expect("warm-up");
        let mut via = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let t = Instant::now();
            let v = ferry.post("/v1/cache", &get).await.expect("ferry get");
            via.push(t.elapsed());
            assert_eq!(v["value"].as_str().map(str::len), Some(100));
        }
        ctx.step(&format!("redis: webdis, RTT {rtt:?}"));
        let to_webdis = LatencyProxy::start(ctx.webdis_addr, *rtt)
            .await
            .expect("proxy");
        let webdis = reqwest::Client::new();
        let url = format!("http://{}/GET/{KEY}", to_webdis.addr);
        webdis.get(&url).send().await.expect("warm-up");
        let mut via_webdis = Vec::with_capacity(plan.samples);
        for _ in 0..plan.samples {
            let t = Instant::now();
            let r = webdis.get(&url).send().await.expect("webdis get");
            let body = r.bytes().await.expect("webdis body");
            via_webdis.push(t.elapsed());
            assert!(body.len() > 100, "a webdis answer of {} bytes", body.len());
        }
        let ms = rtt.as_secs_f64() * 1000.0;
        out.push(Measurement::latency(
            "redis",
            ms,
            "direct (connect+AUTH+GET)",
            &direct,
        ));
        out.push(Measurement::latency(
            "redis",
            ms,
            "Ferry (pooled, kept-alive)",
            &via,
        ));
        out.push(Measurement::latency(
            "redis",
            ms,
            "direct TLS (connect+TLS+AUTH+GET)",
            &direct_tls,
        ));
        out.push(Measurement::latency(
            "redis",
            ms,
            "Ferry over HTTPS (pooled, kept-alive)",
            &via_https,
        ));
        out.push(Measurement::latency(
            "redis",
            ms,
            "webdis (kept-alive, unsigned)",
            &via_webdis,
        ));
    }
    out
}

//! Many clients at once: `n` keep-alive connections to the sidecar, each sending one signed
//! cache GET and then staying open, as a fleet of edge isolates would. Measures what they cost
//! the sidecar in memory (its RSS while all are open) and that each was answered.

use super::Measurement;
use crate::env::{proc_stat, SECRET};
use crate::Ctx;
use ferry_shared::sign;
use rand::Rng;
use serde_json::json;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub async fn run(ctx: &Ctx, n: usize) -> Measurement {
    let before_kb = proc_stat(ctx.sidecar_pid).rss_kb;
    // Opened a few hundred at a time: the listen backlog is finite, and the point is the
    // connections held, not a connect storm.
    let mut open = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let batch = chunk.iter().map(|_| one(ctx));
        open.extend(futures::future::join_all(batch).await.into_iter().flatten());
    }
    let ok = open.len();
    // Let the sidecar settle with every connection open, then read its memory.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held_kb = proc_stat(ctx.sidecar_pid).rss_kb;
    drop(open);
    Measurement {
        scenario: "throughput",
        rtt_ms: 0.0,
        path: format!("{n} open connections (one signed cache GET each, kept alive)"),
        latency: None,
        figures: json!({
            "connections": n,
            "ok": ok,
            "rss_before_mb": (before_kb as f64 / 102.4).round() / 10.0,
            "rss_held_mb": (held_kb as f64 / 102.4).round() / 10.0,
        }),
    }
}

/// One connection that sent a signed GET and read a 200; None if anything failed.
async fn one(ctx: &Ctx) -> Option<TcpStream> {
    let body = br#"{"op":"get","key":"bench:tp"}"#;
    let path = "/v1/cache";
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let nonce = hex::encode(rand::thread_rng().gen::<[u8; 16]>());
    let h = sign::sign(SECRET.as_bytes(), now, &nonce, "POST", path, body);
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{}: {}\r\n{}: {}\r\n{}: {}\r\n\r\n",
        ctx.sidecar_addr,
        body.len(),
        sign::HEADER_TIMESTAMP,
        h.timestamp,
        sign::HEADER_NONCE,
        h.nonce,
        sign::HEADER_SIGNATURE,
        h.signature
    );
    let mut s = TcpStream::connect(ctx.sidecar_addr).await.ok()?;
    s.write_all(head.as_bytes()).await.ok()?;
    s.write_all(body).await.ok()?;
    // The answer is small: its status line and headers arrive in the first read.
    let mut buf = vec![0u8; 4096];
    let got = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    buf[..got].starts_with(b"HTTP/1.1 200").then_some(s)
}

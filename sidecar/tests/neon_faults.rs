//! `/sql` when Postgres fails: stopped, then frozen (a SIGSTOP). Answers come fast and clear,
//! in Neon's shape, and the door recovers when Postgres does. The binary against a private
//! Postgres and Redis.
mod neon_common;

use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use neon_common::*;
use serde_json::{json, Value};
use std::process::Stdio;

/// Postgres stopped under `/sql`: a fast 503 with Retry-After in the driver's error shape,
/// nothing internal in it, and answers again once Postgres is back, without a restart.
#[test]
fn postgres_stopped_answers_fast_and_recovers() {
    let (_redis, mut pg, s, _dir) = start();
    let read = json!({"query": "SELECT count(*) AS n FROM neon_items"});
    assert_eq!(post(&s, TOKEN, read.clone(), &[]).0, 200);
    pg.stop();
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{TOKEN}@db.ferry.invalid/app");
    let (status, retry_after, body) = s.client.block_on(async {
        let r = reqwest::Client::new()
            .post(url)
            .header("Neon-Connection-String", conn)
            .body(read.to_string())
            .send()
            .await
            .expect("send");
        let retry = r.headers().contains_key("retry-after");
        (r.status().as_u16(), retry, r.text().await.expect("body"))
    });
    assert_eq!(status, 503, "{body}");
    assert!(retry_after, "no Retry-After");
    assert!(body.contains("database_unavailable"), "{body}");
    assert!(
        !body.contains("127.0.0.1") && !body.contains("Connection refused"),
        "{body}"
    );
    pg.start_again();
    ferry_testkit::wait_until(
        "/sql to answer again",
        std::time::Duration::from_secs(15),
        || post(&s, TOKEN, read.clone(), &[]).0 == 200,
    );
}

/// A Postgres that stops answering (every process SIGSTOPped) under `/sql`: concurrent
/// requests answer with a JSON error near the request deadline instead of hanging, requests
/// keep being answered after SIGCONT without a restart, and Postgres never holds more Ferry
/// sessions than the pool.
#[test]
fn a_frozen_postgres_gets_fast_answers_and_recovery() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_NEON_ENABLED", "true"),
            ("FERRY_NEON_TOKEN", TOKEN),
            ("FERRY_POSTGRES_POOL_SIZE", "4"),
            ("FERRY_SERVER_REQUEST_TIMEOUT_MS", "1000"),
            ("FERRY_POSTGRES_CHECKOUT_TIMEOUT_MS", "500"),
        ],
        Stdio::null(),
    );
    let read = |n: i32| json!({"query": "SELECT $1::int + 1 AS n", "params": [n.to_string()]});
    for n in 0..8 {
        assert_eq!(post(&s, TOKEN, read(n), &[]).0, 200);
    }
    let pids = pg.freeze();
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{TOKEN}@db.ferry.invalid/app");
    let answers = s.client.block_on(async {
        // A bound of its own, so a sidecar that hangs fails the test instead of stalling it.
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .expect("client");
        let reads = (0..12).map(|n| {
            let (http, url, conn, body) = (http.clone(), url.clone(), conn.clone(), read(n));
            async move {
                let t = std::time::Instant::now();
                let sent = http
                    .post(url)
                    .header("Neon-Connection-String", conn)
                    .body(body.to_string())
                    .send()
                    .await;
                let (status, body) = match sent {
                    Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
                    Err(e) => (0, Value::String(format!("no answer: {e}"))),
                };
                (status, body, t.elapsed())
            }
        });
        futures::future::join_all(reads).await
    });
    pg.thaw(&pids);
    let slowest = answers.iter().map(|(_, _, t)| *t).max().unwrap_or_default();
    for (status, body, _) in &answers {
        assert!(matches!(status, 503 | 504), "{status}: {body}");
        assert!(
            body["code"].is_string() && body["message"].is_string(),
            "{body}"
        );
    }
    println!("12 /sql reads against a frozen Postgres answered within {slowest:?} (deadline 1 s)");
    assert!(
        slowest < std::time::Duration::from_millis(2500),
        "an answer took {slowest:?} with a 1 s deadline"
    );
    ferry_testkit::wait_until(
        "/sql to recover",
        std::time::Duration::from_secs(20),
        || (0..6).all(|n| post(&s, TOKEN, read(n), &[]).0 == 200),
    );
    let backends = pg.sidecar_backends();
    assert!(backends <= 4, "{backends} Ferry sessions for a pool of 4");
}

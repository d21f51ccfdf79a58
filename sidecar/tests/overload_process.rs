//! Overload against the real binary (its own process, so its memory is its own): 2,000
//! concurrent connections keep being served; 10x more slow queries than the pool holds get a
//! fast 503 + Retry-After while /healthz still answers; peak RSS stays bounded.
use ferry_testkit::{self as common, PgServer, RedisServer};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

use common::peak_rss_kb;

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// GET over a fresh std socket; the status code (0 if none).
fn raw_get(port: u16, path: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[test]
fn two_thousand_connections_and_ten_times_the_pool() {
    // Room for 2,000 client sockets here and 2,000 in the sidecar (inherited at spawn).
    let _ = Command::new("prlimit")
        .args([
            "--pid",
            &std::process::id().to_string(),
            "--nofile=16384:16384",
        ])
        .status();
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let mut sidecar = common::SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[("FERRY_SERVER_MAX_IN_FLIGHT", "4096")],
        Stdio::null(),
    );
    let (pid, port, c) = (sidecar.pid(), sidecar.port, sidecar.client.clone());
    let cached = json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 300}});
    c.query(cached.clone());
    let rss_idle = peak_rss_kb(pid);

    // 2,000 concurrent connections, one cached read each.
    let answers = c.block_on(async {
        let all = (0..2000).map(|_| {
            let c = c.clone();
            let body = cached.clone();
            async move {
                // A client of its own: a connection of its own.
                let own = reqwest::Client::new();
                let mut c2 = c.clone();
                c2.http = own;
                let t = Instant::now();
                let r = c2.post("/v1/query", &body).await;
                (r.status, t.elapsed())
            }
        });
        futures::future::join_all(all).await
    });
    let errors = answers.iter().filter(|(s, _)| *s != 200).count();
    let p99 = pct(answers.iter().map(|(_, d)| *d).collect(), 0.99);
    let rss_after_conns = peak_rss_kb(pid);

    // 10x the Postgres pool (10) in slow queries.
    let (slow, health) = std::thread::scope(|s| {
        let slow = s.spawn(|| {
            c.block_on(async {
                let all = (0..100).map(|i| {
                    let c = c.clone();
                    async move {
                        let t = Instant::now();
                        let r = c
                            .post(
                                "/v1/query",
                                &json!({"sql": format!("SELECT pg_sleep(2)::text AS s, {i} AS i")}),
                            )
                            .await;
                        (
                            r.status,
                            r.code().to_string(),
                            r.headers.contains_key("retry-after"),
                            t.elapsed(),
                        )
                    }
                });
                futures::future::join_all(all).await
            })
        });
        std::thread::sleep(Duration::from_millis(500));
        // A plain socket, so nothing on the client side is shared with the slow requests.
        let t = Instant::now();
        let h = raw_get(port, "/healthz");
        (slow.join().expect("slow"), (h, t.elapsed()))
    });
    let ok = slow.iter().filter(|r| r.0 == 200).count();
    let refused: Vec<_> = slow.iter().filter(|r| r.0 == 503).collect();
    let slowest_refusal = refused.iter().map(|r| r.3).max().unwrap_or_default();
    let rss_peak = peak_rss_kb(pid);
    println!(
        "FIGURES overload: 2000 concurrent connections: {errors} errors, p99 {p99:?}; 100 slow queries \
         on a pool of 10: {ok} served, {} refused with 503 (slowest refusal {slowest_refusal:?}), \
         /healthz {} in {:?}; peak RSS {} KB idle, {} KB after 2000 connections, {} KB at the end",
        refused.len(),
        health.0,
        health.1,
        rss_idle,
        rss_after_conns,
        rss_peak
    );
    sidecar.terminate();

    assert_eq!(errors, 0, "2,000 concurrent connections all served");
    assert_eq!(ok, 10, "one slow query per pooled connection");
    assert_eq!(refused.len(), 90);
    assert!(
        refused.iter().all(|r| r.1 == "overloaded" && r.2),
        "503 overloaded with Retry-After"
    );
    assert!(
        slowest_refusal < Duration::from_millis(1900),
        "refused before the slow ones ended"
    );
    assert_eq!(health.0, 200);
    assert!(
        rss_peak < 256 * 1024,
        "peak RSS {rss_peak} KB stays bounded"
    );
}

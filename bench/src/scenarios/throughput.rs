//! Scenario 5: requests per second at equal concurrency on loopback. A cache-hit GET through
//! Ferry vs webdis (HTTP-to-Redis in C) vs redis-benchmark (raw Redis); cached vs uncached
//! `/v1/query` vs `pgbench -S` on the same table. Ferry and webdis get the same load generator.
//! Beside requests/s, each HTTP server's own CPU per 1,000 requests, read from /proc for the
//! server process alone (the load generator shares the machine; its cost does not count). Last,
//! the sidecar holds 2,000 open connections (its peak RSS is the scenario's).

use super::{Measurement, Plan};
use crate::env::{await_reaped, child_count, pgbench, proc_stat, tree_cpu_ticks};
use crate::ferry::Ferry;
use crate::Ctx;
use rand::Rng;
use serde_json::json;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let c = plan.concurrency;
    let d = plan.throughput_for;
    let ferry = Ferry::new(format!("http://{}", ctx.sidecar_addr), c);
    ferry
        .post(
            "/v1/cache",
            &json!({"op": "set", "key": "bench:tp", "value": "v".repeat(100)}),
        )
        .await
        .expect("set");
    let mut out = Vec::new();

    ctx.step("throughput: Ferry cache GET");
    let get = json!({"op": "get", "key": "bench:tp"})
        .to_string()
        .into_bytes();
    let run = load(c, d, {
        let f = ferry.clone();
        move || {
            let (f, get) = (f.clone(), get.clone());
            async move { f.post_raw("/v1/cache", get).await.is_ok() }
        }
    });
    let rps = on_server(ctx.sidecar_pid, run).await;
    out.push(row("cache GET: Ferry (/v1/cache, signed)", rps, c));

    // Where Ferry's time goes: the same server answering an unsigned GET /healthz (HTTP and
    // actix only: no signature, no JSON body, no blocking hop, no Redis).
    let floor = get_load(c, d, format!("http://{}/healthz", ctx.sidecar_addr));
    let rps = on_server(ctx.sidecar_pid, floor).await;
    out.push(row("floor: Ferry GET /healthz (HTTP only)", rps, c));

    // The same GET through the Upstash-compatible endpoint (a bearer token, no signature).
    let upstash = format!("http://{}/", ctx.sidecar_addr);
    let token = crate::env::UPSTASH_TOKEN;
    let http = reqwest::Client::new();
    http.post(&upstash)
        .bearer_auth(token)
        .json(&json!(["SET", "tp", "v".repeat(100)]))
        .send()
        .await
        .expect("upstash set");
    let run = load(c, d, move || {
        let (http, url) = (http.clone(), upstash.clone());
        async move {
            match http
                .post(&url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(r#"["GET","tp"]"#)
                .send()
                .await
            {
                Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                Err(_) => false,
            }
        }
    });
    let rps = on_server(ctx.sidecar_pid, run).await;
    out.push(row("cache GET: Ferry (Upstash REST, bearer token)", rps, c));

    ctx.step("throughput: webdis GET");
    let url = format!("http://{}/GET/ferry:k:bench:tp", ctx.webdis_addr);
    let rps = on_server(ctx.webdis_pid, get_load(c, d, url)).await;
    out.push(row("cache GET: webdis", rps, c));

    ctx.step("throughput: redis-benchmark GET");
    let n = (d.as_secs_f64() * 50_000.0) as u64;
    let rb = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &ctx.redis_addr.port().to_string()])
        .args([
            "-a",
            &ctx.redis_password,
            "-c",
            &c.to_string(),
            "-n",
            &n.to_string(),
        ])
        .args(["-t", "get", "--csv"])
        .output();
    let rps = rb
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains("GET"))
                .and_then(|l| l.split(',').nth(1).map(|v| v.trim_matches('"').to_string()))
        })
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let rate = Rate {
        rps,
        cpu_ms_per_1k: None,
        pg_cpu_ms_per_1k: None,
    };
    out.push(row("cache GET: redis-benchmark (raw Redis)", rate, c));

    let sql = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";
    for (label, cached, named) in [
        ("query: Ferry cached (/v1/query hit)", true, false),
        ("query: Ferry uncached (/v1/query, raw SQL)", false, false),
        (
            "query: Ferry uncached named query (/v1/query, found plain: no reset)",
            false,
            true,
        ),
    ] {
        ctx.step(&format!("throughput: {label}"));
        if cached {
            for aid in 1..=100 {
                ferry
                    .post(
                        "/v1/query",
                        &json!({"sql": sql, "params": [aid], "cache": {"ttl_s": 600}}),
                    )
                    .await
                    .expect("fill");
            }
        }
        // Serialized before the clock starts, as the GET's body is: the load generator's own
        // cost per request (it shares the two cores) is then the same for every row.
        let bodies: Arc<Vec<Vec<u8>>> = Arc::new(
            (1..=if cached { 100 } else { 100_000 })
                .map(|aid| {
                    let body = if cached {
                        json!({"sql": sql, "params": [aid], "cache": {"ttl_s": 600}})
                    } else if named {
                        json!({"query": crate::env::POINT_READ, "params": [aid]})
                    } else {
                        json!({"sql": sql, "params": [aid]})
                    };
                    body.to_string().into_bytes()
                })
                .collect(),
        );
        let f = ferry.clone();
        let run = load(c, d, move || {
            let f = f.clone();
            let body = bodies[rand::thread_rng().gen_range(0..bodies.len())].clone();
            async move { f.post_raw("/v1/query", body).await.is_ok() }
        });
        let rate = on_servers(ctx.sidecar_pid, Some(ctx.pg_pid), run).await;
        out.push(row(label, rate, c));
    }

    // The uncached read through the Neon-compatible endpoint, as @neondatabase/serverless
    // sends it (text parameters and results: two round trips to Postgres per statement).
    ctx.step("throughput: Ferry uncached (/sql)");
    let endpoint = format!("http://{}/sql", ctx.sidecar_addr);
    let conn = format!(
        "postgresql://bench:{}@ferry.invalid/bench",
        crate::env::NEON_TOKEN
    );
    let http = reqwest::Client::new();
    let run = load(c, d, move || {
        let (http, url, conn) = (http.clone(), endpoint.clone(), conn.clone());
        async move {
            let aid = rand::thread_rng().gen_range(1..=100_000);
            let body = json!({"query": sql, "params": [aid.to_string()]});
            match http
                .post(&url)
                .header("Neon-Connection-String", conn)
                .header("Neon-Raw-Text-Output", "true")
                .header("Neon-Array-Mode", "true")
                .body(body.to_string())
                .send()
                .await
            {
                Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                Err(_) => false,
            }
        }
    });
    let rate = on_servers(ctx.sidecar_pid, Some(ctx.pg_pid), run).await;
    out.push(row("query: Ferry uncached (/sql, Neon protocol)", rate, c));

    ctx.step("throughput: pgbench -S");
    let backends_before = child_count(ctx.pg_pid);
    let pg_before = tree_cpu_ticks(ctx.pg_pid);
    let pb = Command::new(pgbench())
        .args([
            "-S",
            "-n",
            "-c",
            &c.to_string(),
            "-j",
            "2",
            "-T",
            &d.as_secs().max(1).to_string(),
        ])
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &ctx.pg_addr.port().to_string(),
            "-U",
            "postgres",
            "postgres",
        ])
        .env("PGPASSWORD", &ctx.pg_password)
        // Like for like: the sidecar's connections to this Postgres are in the clear (loopback,
        // no sslmode), so pgbench's are too. Left to libpq's default (`prefer`) it used TLS,
        // since the bench's Postgres accepts it: 14.1-14.3k against 20.1-22.5k tps in the clear
        // (5 s runs, 32 clients), which flattered every ratio against it by about 1.5x.
        .env("PGSSLMODE", "disable")
        .output();
    await_reaped(ctx.pg_pid, backends_before);
    let pg_ticks = tree_cpu_ticks(ctx.pg_pid).saturating_sub(pg_before);
    let stdout = pb
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // "tps = 59194.1 (without initial connection time)", "...actually processed: 295970"
    let figure = |prefix: &str, nth: usize| {
        stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(nth))
            .and_then(|v| v.split('/').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let rps = figure("tps =", 2).unwrap_or(0.0);
    let txns = figure("number of transactions actually processed:", 5).unwrap_or(0.0);
    out.push(row(
        "query: pgbench -S (raw Postgres, persistent connections)",
        Rate {
            rps,
            cpu_ms_per_1k: None,
            pg_cpu_ms_per_1k: (txns > 0.0).then(|| pg_ticks as f64 * 10.0 * 1000.0 / txns),
        },
        c,
    ));

    ctx.step("throughput: one client at 0 RTT");
    out.extend(super::one_client::run(ctx, plan).await);

    ctx.step("throughput: 2,000 open connections");
    out.push(super::open_connections::run(ctx, 2000).await);
    out
}

/// Requests/s, and the server's own CPU per 1,000 requests when it was measured (and
/// Postgres', for the paths that reach it).
struct Rate {
    rps: f64,
    cpu_ms_per_1k: Option<f64>,
    pg_cpu_ms_per_1k: Option<f64>,
}

/// Runs a load against the server `pid` and reads that process' CPU time around it.
async fn on_server(pid: u32, run: impl std::future::Future<Output = (f64, u64)>) -> Rate {
    on_servers(pid, None, run).await
}

/// `on_server`, also reading Postgres' CPU time (the postmaster `pg` and its backends).
async fn on_servers(
    pid: u32,
    pg: Option<u32>,
    run: impl std::future::Future<Output = (f64, u64)>,
) -> Rate {
    let before = (proc_stat(pid).cpu_ticks, pg.map(tree_cpu_ticks));
    let (rps, n) = run.await;
    let after = (proc_stat(pid).cpu_ticks, pg.map(tree_cpu_ticks));
    // Linux reports CPU time in clock ticks of 1/100 s.
    let per_1k = |ticks: u64| (n > 0).then(|| ticks as f64 * 10.0 * 1000.0 / n as f64);
    Rate {
        rps,
        cpu_ms_per_1k: per_1k(after.0.saturating_sub(before.0)),
        pg_cpu_ms_per_1k: match (before.1, after.1) {
            (Some(b), Some(a)) => per_1k(a.saturating_sub(b)),
            _ => None,
        },
    }
}

fn row(path: &str, rate: Rate, concurrency: usize) -> Measurement {
    Measurement {
        scenario: "throughput",
        rtt_ms: 0.0,
        path: path.into(),
        latency: None,
        figures: json!({
            "rps": rate.rps.round(),
            "concurrency": concurrency,
            "server_cpu_ms_per_1k": rate.cpu_ms_per_1k.map(|v| (v * 100.0).round() / 100.0),
            "postgres_cpu_ms_per_1k": rate.pg_cpu_ms_per_1k.map(|v| (v * 100.0).round() / 100.0),
        }),
    }
}

/// Plain GETs of `url` (webdis, and Ferry's unsigned /healthz floor) under the same load.
async fn get_load(concurrency: usize, dur: Duration, url: String) -> (f64, u64) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap_or_default();
    load(concurrency, dur, move || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            match http.get(&url).send().await {
                Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await
}

/// Runs `concurrency` workers calling `f` until `dur` passes: successful calls per second, and
/// all calls made.
pub(super) async fn load<F, Fut>(concurrency: usize, dur: Duration, f: F) -> (f64, u64)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let ok = Arc::new(AtomicU64::new(0));
    let all = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers = (0..concurrency).map(|_| {
        let (f, ok, all) = (f.clone(), ok.clone(), all.clone());
        tokio::spawn(async move {
            while start.elapsed() < dur {
                if f().await {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                all.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    futures::future::join_all(workers).await;
    let rps = ok.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    (rps, all.load(Ordering::Relaxed))
}

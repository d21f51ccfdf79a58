//! The throughput rows again with the two cores split on purpose: the load generator on core
//! 0, every server under test with its Redis and Postgres on core 1 (`taskset`), the same for
//! Ferry and for each peer; then the same loads unpinned, beside them. The load generator is
//! `wrk` (in C, one thread), far cheaper per request than the bench's own: its CPU per request
//! is read from /proc and shown beside each server's, so its cost is measured, not assumed.
//! Signed requests are signed ahead of the clock (each with a nonce of its own, well within the
//! clock window) and replayed by `wrk` from a file, one per request; `pgbench -S` is pinned the
//! same way against the same Postgres.

use super::wrk::{script, waited_ticks, wrk, Load, Requests, Wrk};
use super::{Measurement, Plan};
use crate::env::{await_reaped, child_count, pgbench, proc_stat, tree_cpu_ticks};
use crate::ferry::Ferry;
use crate::Ctx;
use rand::Rng;
use serde_json::json;
use std::process::Command;
use std::time::Duration;

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 || Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("pinned: needs 2 cores and wrk (scripts/bench.sh installs it); skipped");
        return Vec::new();
    }
    let (c, d) = (
        plan.concurrency,
        plan.throughput_for.min(Duration::from_secs(3)),
    );
    let dir = tempfile::tempdir().expect("tempdir for wrk's scripts");
    let ferry = Ferry::new(format!("http://{}", ctx.sidecar_addr), 4);
    ferry
        .post(
            "/v1/cache",
            &json!({"op": "set", "key": "bench:tp", "value": "v".repeat(100)}),
        )
        .await
        .expect("set the key");
    let sidecar = format!("http://{}", ctx.sidecar_addr);
    let bearer = format!("Bearer {}", crate::env::UPSTASH_TOKEN);
    reqwest::Client::new()
        .post(format!("{sidecar}/"))
        .header("authorization", &bearer)
        .body(format!(r#"["SET","tp","{}"]"#, "v".repeat(100)))
        .send()
        .await
        .expect("upstash set");
    for aid in 1..=100 {
        ferry
            .post(
                "/v1/query",
                &json!({"sql": HIT_SQL, "params": [aid], "cache": {"ttl_s": 600}}),
            )
            .await
            .expect("fill");
    }
    let loads = [
        Load {
            path: "cache GET: webdis",
            url: format!("http://{}/GET/ferry:k:bench:tp", ctx.webdis_addr),
            what: Requests::Get,
            postgres: false,
            server: ctx.webdis_pid,
        },
        Load {
            path: "cache GET: Ferry (Upstash REST, bearer token)",
            url: format!("{sidecar}/"),
            what: Requests::Post {
                body: r#"["GET","tp"]"#.into(),
                headers: vec![("Authorization".into(), bearer.clone())],
            },
            postgres: false,
            server: ctx.sidecar_pid,
        },
        Load {
            path: "cache GET: Ferry (/v1/cache, signed)",
            url: sidecar.clone(),
            what: Requests::Signed {
                path: "/v1/cache",
                body: |_| r#"{"op":"get","key":"bench:tp"}"#.into(),
            },
            postgres: false,
            server: ctx.sidecar_pid,
        },
        Load {
            path: "query: Ferry cached (/v1/query hit)",
            url: sidecar.clone(),
            what: Requests::Signed {
                path: "/v1/query",
                body: |n| {
                    json!({"sql": HIT_SQL, "params": [n % 100 + 1], "cache": {"ttl_s": 600}})
                        .to_string()
                },
            },
            postgres: false,
            server: ctx.sidecar_pid,
        },
        Load {
            path: "query: Ferry uncached named query (/v1/query, found plain: no reset)",
            url: sidecar.clone(),
            what: Requests::Signed {
                path: "/v1/query",
                body: |_| {
                    let aid = rand::thread_rng().gen_range(1..=100_000);
                    json!({"query": crate::env::POINT_READ, "params": [aid]}).to_string()
                },
            },
            postgres: true,
            server: ctx.sidecar_pid,
        },
        Load {
            path: "query: Ferry uncached (/v1/query, raw SQL)",
            url: sidecar.clone(),
            what: Requests::Signed {
                path: "/v1/query",
                body: |_| {
                    let aid = rand::thread_rng().gen_range(1..=100_000);
                    json!({"sql": HIT_SQL, "params": [aid]}).to_string()
                },
            },
            postgres: true,
            server: ctx.sidecar_pid,
        },
    ];
    let redis_pid = crate::scenarios::scale::redis_pid(ctx).await.unwrap_or(0);
    let mut servers = vec![ctx.sidecar_pid, ctx.webdis_pid, redis_pid];
    servers.extend(crate::env::tree_pids(ctx.pg_pid));
    let mut out = Vec::new();
    for pinned in [true, false] {
        pin(&servers, if pinned { "1" } else { "0-1" });
        for load in &loads {
            ctx.step(&format!(
                "pinned: {} ({})",
                load.path,
                if pinned { "pinned" } else { "unpinned" }
            ));
            let script = script(dir.path(), load, d, ctx);
            let before = Before::read(ctx, load).await;
            let w = wrk(pinned, c, d, &load.url, &script);
            let after = Before::read(ctx, load).await;
            out.push(row(load.path, pinned, c, &w, &before, &after));
            let _ = std::fs::remove_file(dir.path().join("requests"));
        }
        ctx.step(&format!(
            "pinned: pgbench -S ({})",
            if pinned { "pinned" } else { "unpinned" }
        ));
        out.push(pgbench_row(ctx, pinned, c, d));
    }
    pin(&servers, "0-1");
    out
}

/// The point read of `pgbench -S`, as raw SQL.
const HIT_SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";

/// Every thread of each of `pids` on `cpus` (a `taskset` list). Postgres's backends started
/// later inherit the postmaster's.
pub(super) fn pin(pids: &[u32], cpus: &str) {
    for pid in pids.iter().filter(|p| **p != 0) {
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", cpus, &pid.to_string()])
            .output();
    }
}
/// The servers' CPU before (or after) a load: the server's ticks, Postgres's, Redis's seconds.
struct Before {
    server: u64,
    postgres: Option<u64>,
    redis_s: Option<f64>,
}

impl Before {
    async fn read(ctx: &Ctx, load: &Load) -> Before {
        Before {
            server: proc_stat(load.server).cpu_ticks,
            postgres: load.postgres.then(|| tree_cpu_ticks(ctx.pg_pid)),
            redis_s: crate::scenarios::scale::redis_cpu_s(ctx).await,
        }
    }
}

fn row(path: &str, pinned: bool, c: usize, w: &Wrk, b: &Before, a: &Before) -> Measurement {
    let n = w.ok.max(1) as f64;
    // Linux counts CPU in ticks of 10 ms: microseconds per request.
    let us = |ticks: u64| (ticks as f64 * 10_000.0 / n * 100.0).round() / 100.0;
    let redis = match (b.redis_s, a.redis_s) {
        (Some(b), Some(a)) => Some(((a - b) * 1e6 / n * 100.0).round() / 100.0),
        _ => None,
    };
    let postgres = match (b.postgres, a.postgres) {
        (Some(b), Some(a)) => Some(us(a.saturating_sub(b))),
        _ => None,
    };
    Measurement {
        scenario: "pinned",
        rtt_ms: 0.0,
        path: format!("{path} [{}]", if pinned { "pinned" } else { "unpinned" }),
        latency: None,
        figures: json!({
            "rps": (w.ok as f64 / w.seconds).round(),
            "errors": w.errors,
            "concurrency": c,
            "server_cpu_us": us(a.server.saturating_sub(b.server)),
            "redis_cpu_us": redis,
            "postgres_cpu_us": postgres,
            "generator_cpu_us": us(w.own_ticks),
        }),
    }
}

/// `pgbench -S` (pinned to core 0 with one thread, or unpinned with two) against the same
/// Postgres, in the clear as the sidecar's own connections are.
fn pgbench_row(ctx: &Ctx, pinned: bool, c: usize, d: Duration) -> Measurement {
    let backends = child_count(ctx.pg_pid);
    let pg_before = tree_cpu_ticks(ctx.pg_pid);
    let mut cmd = format!(
        "{}{} -S -n -c {c} -j {} -T {} -h 127.0.0.1 -p {} -U postgres postgres",
        if pinned { "taskset -c 0 " } else { "" },
        pgbench().display(),
        if pinned { 1 } else { 2 },
        d.as_secs().max(1),
        ctx.pg_addr.port()
    );
    cmd.push_str("; echo \"STAT $(cat /proc/$$/stat)\"");
    let out = Command::new("sh")
        .args(["-c", &cmd])
        .env("PGPASSWORD", &ctx.pg_password)
        .env("PGSSLMODE", "disable")
        .output()
        .expect("run pgbench");
    await_reaped(ctx.pg_pid, backends);
    let pg_ticks = tree_cpu_ticks(ctx.pg_pid).saturating_sub(pg_before);
    let text = String::from_utf8_lossy(&out.stdout);
    let figure = |prefix: &str, nth: usize| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(nth))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let tps = figure("tps =", 2).unwrap_or(0.0);
    let txns = figure("number of transactions actually processed:", 5).unwrap_or(0.0);
    let own = waited_ticks(&text);
    let us =
        |ticks: u64| (txns > 0.0).then(|| (ticks as f64 * 10_000.0 / txns * 100.0).round() / 100.0);
    Measurement {
        scenario: "pinned",
        rtt_ms: 0.0,
        path: format!(
            "query: pgbench -S [{}]",
            if pinned { "pinned" } else { "unpinned" }
        ),
        latency: None,
        figures: json!({
            "rps": tps.round(),
            "errors": 0,
            "concurrency": c,
            "server_cpu_us": null,
            "redis_cpu_us": null,
            "postgres_cpu_us": us(pg_ticks),
            "generator_cpu_us": us(own),
        }),
    }
}

//! Where the blog mix's server CPU went, apart (#43: "measure the stream consumer's cost
//! apart"): the sidecar's change-stream threads (`ferry-changes` and its runtime's blocking
//! threads: decoding, what each change makes stale, the invalidations, the visibility wait)
//! against the rest of the sidecar; in
//! Postgres, the walsender that decodes the WAL for the stream, the stream's own session (the
//! visibility query, marks) and the writer's backend, against the rest (the reads); in Redis, each
//! command's own time (`INFO commandstats`), by command. Read before and after one configuration,
//! from /proc and Redis, so the load generator's cost is not in them.

use crate::env::{thread_ticks, tree_cpu_ticks};
use crate::Ctx;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// A reading of the parts at one instant.
pub(super) struct Reading {
    stream_thread: u64,
    backends: BTreeMap<&'static str, (Vec<u32>, u64)>,
    redis: BTreeMap<String, u64>,
}

/// The Postgres backends named apart, by what they are.
async fn backends(ctx: &Ctx, writer_pid: i32) -> BTreeMap<&'static str, Vec<u32>> {
    let mut out: BTreeMap<&'static str, Vec<u32>> = BTreeMap::new();
    let client = super::pg_client(ctx).await;
    let rows = client
        .query(
            "SELECT pid, coalesce(application_name, '') FROM pg_stat_activity",
            &[],
        )
        .await
        .unwrap_or_default();
    for r in rows {
        let (pid, app): (i32, String) = (r.get(0), r.get(1));
        let part = match app.as_str() {
            "ferry-changes-stream" => "walsender",
            "ferry-changes" => "stream's session",
            _ if pid == writer_pid => "writer",
            _ => continue,
        };
        out.entry(part).or_default().push(pid as u32);
    }
    out
}

/// Redis's own microseconds per command so far (`cmdstat_get:calls=1,usec=5,...`).
async fn command_usec(ctx: &Ctx) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(mut c) = crate::resp::Conn::connect(ctx.redis_addr).await else {
        return out;
    };
    if c.cmd(&[b"AUTH", ctx.redis_password.as_bytes()])
        .await
        .is_err()
    {
        return out;
    }
    let info = c.cmd(&[b"INFO", b"commandstats"]).await.unwrap_or_default();
    for line in String::from_utf8_lossy(&info).lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let usec = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("usec="))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        out.insert(name.to_string(), usec);
    }
    out
}

impl Reading {
    pub(super) async fn now(ctx: &Ctx, sidecar_pid: u32, writer_pid: i32) -> Reading {
        let backends = backends(ctx, writer_pid)
            .await
            .into_iter()
            .map(|(part, pids)| {
                let ticks = pids.iter().map(|p| tree_cpu_ticks(*p)).sum();
                (part, (pids, ticks))
            })
            .collect();
        Reading {
            stream_thread: thread_ticks(sidecar_pid, "ferry-changes"),
            backends,
            redis: command_usec(ctx).await,
        }
    }

    /// The parts' CPU since `self`, in microseconds per read; the same backends read again.
    pub(super) async fn since(&self, ctx: &Ctx, sidecar_pid: u32, reads: u64) -> Value {
        let per_read = |us: f64| (us * 10.0 / reads.max(1) as f64).round() / 10.0;
        // Clock ticks are 10 ms.
        let ticks_us = |t: u64| t as f64 * 10_000.0;
        let mut pg = Map::new();
        for (part, (pids, before)) in &self.backends {
            let after: u64 = pids.iter().map(|p| tree_cpu_ticks(*p)).sum();
            pg.insert(
                part.to_string(),
                json!(per_read(ticks_us(after.saturating_sub(*before)))),
            );
        }
        let stream = thread_ticks(sidecar_pid, "ferry-changes").saturating_sub(self.stream_thread);
        let after = command_usec(ctx).await;
        let mut redis: Vec<(String, f64)> = after
            .iter()
            .map(|(name, usec)| {
                let before = self.redis.get(name).copied().unwrap_or(0);
                (name.clone(), per_read(usec.saturating_sub(before) as f64))
            })
            .filter(|(_, us)| *us >= 0.1)
            .collect();
        redis.sort_by(|a, b| b.1.total_cmp(&a.1));
        json!({
            "sidecar_stream_thread": per_read(ticks_us(stream)),
            "postgres": pg,
            "redis_commands": redis.into_iter().map(|(n, us)| json!([n, us])).collect::<Vec<_>>(),
        })
    }
}

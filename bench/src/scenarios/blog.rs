//! An application's mix, three ways in one run (#43): a blog (a post by id, the recent posts,
//! a post's comments, an author's page through a view over a join), 95% reads through Ferry
//! and 5% writes from a plain Postgres client that bypasses Ferry (a post's title and version,
//! a new comment). The same load against:
//! - no cache (every read goes to Postgres);
//! - TTL only, at Hyperdrive's defaults (max_age 60 s, stale-while-revalidate 15 s), a sidecar
//!   with the change stream off;
//! - Ferry's inferred caching: `"cache": {"ttl_s": 60}`, no tables named, the change stream on.
//!
//! Per configuration: reads/s, hit rate, Postgres's CPU per read (its whole process tree, the
//! writes' share included), and stale reads past the bound: a read of a post by id that
//! started more than `changes.max_lag_ms` (1 s) after a commit of a newer version of that
//! post, and returned an older one.
//!
//! Each configuration runs twice (#42, decision 5): pinned (the load generator, this process,
//! on core 0; the sidecars, Redis and Postgres on core 1), then unpinned. Pinned, the reads/s
//! are the servers' own: the generator signs and parses on a core of its own, its CPU per read
//! measured and shown beside theirs.

use super::blog_split::Reading;
use super::{Measurement, Plan};
use crate::env::{proc_stat, tree_cpu_ticks};
use crate::ferry::Ferry;
use crate::stats::Summary;
use crate::Ctx;
use rand::Rng;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The schema and rows (made with the bench's Postgres, before the sidecars start). Posts are
/// read by `author_id`, a column outside their key: under REPLICA IDENTITY FULL (as API.md
/// advises for such tables) the stream sends an edited post's old author, so an edit drops
/// only its author's page, not every author's.
pub const SCHEMA: &str = "
CREATE TABLE authors (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE posts (id int PRIMARY KEY, author_id int NOT NULL REFERENCES authors,
                    title text NOT NULL, version bigint NOT NULL DEFAULT 1);
CREATE TABLE comments (id serial PRIMARY KEY, post_id int NOT NULL REFERENCES posts,
                       body text NOT NULL);
CREATE INDEX ON posts (author_id);
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id);
INSERT INTO authors SELECT i, 'author ' || i FROM generate_series(1, 100) i;
INSERT INTO posts (id, author_id, title) SELECT i, 1 + i % 100, 'post ' || i FROM generate_series(1, 2000) i;
INSERT INTO comments (post_id, body) SELECT 1 + i % 2000, 'comment ' || i FROM generate_series(1, 10000) i;
CREATE VIEW author_page AS
  SELECT a.id AS author_id, a.name, count(p.id)::int AS posts, max(p.title) AS last_title
    FROM authors a LEFT JOIN posts p ON p.author_id = a.id GROUP BY a.id, a.name;
ALTER PUBLICATION ferry ADD TABLE authors, posts, comments;
";

/// The tables the change stream must watch for the inferred configuration.
pub const TABLES: &str = "authors,posts,comments";

pub const NO_CACHE: &str = "no cache";
pub const TTL_ONLY: &str = "TTL only (max_age 60 s, SWR 15 s)";
pub const INFERRED: &str = "Ferry, inferred (ttl_s 60, no tables named)";

/// The freshness bound reads are judged by (the sidecar's `changes.max_lag_ms`).
const BOUND: Duration = Duration::from_millis(1_000);
/// Clients reading at once, per configuration.
const READERS: usize = 16;

/// Post ids as an application's traffic falls: 80% on the 200 most read.
fn post_id(rng: &mut impl Rng) -> i32 {
    match rng.gen_bool(0.8) {
        true => rng.gen_range(1..=200),
        false => rng.gen_range(1..=2000),
    }
}

/// Commits of each post's version (when, which version): what the reads are judged by.
type Commits = Arc<Mutex<HashMap<i32, Vec<(Instant, i64)>>>>;

/// The four reads of the mix, in the order `one_read` picks them.
const KINDS: [&str; 4] = [
    "post by id",
    "recent posts",
    "a post's comments",
    "an author's page",
];

fn kind(pick: u32) -> usize {
    match pick {
        0..=39 => 0,
        40..=59 => 1,
        60..=79 => 2,
        _ => 3,
    }
}

#[derive(Default)]
struct Counts {
    reads: AtomicU64,
    hits: AtomicU64,
    /// Reads and hits by kind of read.
    kind_reads: [AtomicU64; 4],
    kind_hits: [AtomicU64; 4],
    stale: AtomicU64,
    writes: AtomicU64,
    errors: AtomicU64,
}

/// One read of the mix; (cache status and the answer's age in ms, the post's version when it was
/// a post by id).
async fn one_read(
    f: &Ferry,
    cache: &Value,
    rng_pick: u32,
    id: i32,
) -> Result<((String, u64), Option<i64>), String> {
    let (sql, params) = match rng_pick {
        0..=39 => (
            "SELECT id, title, version FROM posts WHERE id = $1",
            json!([id]),
        ),
        40..=59 => (
            "SELECT id, title FROM posts ORDER BY id DESC LIMIT 10",
            json!([]),
        ),
        60..=79 => (
            "SELECT id, body FROM comments WHERE post_id = $1 ORDER BY id",
            json!([id]),
        ),
        _ => (
            "SELECT * FROM author_page WHERE author_id = $1",
            json!([1 + id % 100]),
        ),
    };
    let mut body = json!({"sql": sql, "params": params});
    if !cache.is_null() {
        body["cache"] = cache.clone();
    }
    let v = f.post("/v1/query", &body).await?;
    let version = (rng_pick < 40)
        .then(|| v["rows"][0]["version"].as_i64())
        .flatten();
    let status = v["cache"].as_str().unwrap_or_default().to_string();
    Ok(((status, v["age_ms"].as_u64().unwrap_or(0)), version))
}

/// When `version` of post `id`, read by a read that started at `started`, is older than a
/// version committed more than the bound before it: how long past the bound the read started,
/// and the newest such version.
fn stale(commits: &Commits, id: i32, started: Instant, version: i64) -> Option<(Duration, i64)> {
    let c = commits.lock().unwrap_or_else(|p| p.into_inner());
    c.get(&id)?
        .iter()
        .filter(|(at, v)| *v > version && *at + BOUND < started)
        .map(|(at, v)| (started - (*at + BOUND), *v))
        .max_by_key(|(_, v)| *v)
}

async fn configuration(
    ctx: &Ctx,
    name: &'static str,
    (addr, sidecar_pid): (std::net::SocketAddr, u32),
    cache: Value,
    (run_for, pinned): (Duration, bool),
) -> Measurement {
    let f = Arc::new(Ferry::new(format!("http://{addr}"), READERS));
    let counts = Arc::new(Counts::default());
    let commits: Commits = Arc::default();
    let writer = Arc::new(super::pg_client(ctx).await);
    let latencies = Arc::new(Mutex::new(Vec::new()));
    // Warm-up: each read once, so the run measures the steady state of each configuration.
    for pick in [0, 40, 60, 80] {
        for id in 1..=20 {
            let _ = one_read(&f, &cache, pick, id).await;
        }
    }
    let redis_pid = super::scale::redis_pid(ctx).await.unwrap_or(0);
    let writer_pid: i32 = match writer.query_one("SELECT pg_backend_pid()", &[]).await {
        Ok(row) => row.get(0),
        Err(_) => 0,
    };
    let parts = Reading::now(ctx, sidecar_pid, writer_pid).await;
    let pg_before = tree_cpu_ticks(ctx.pg_pid);
    let (sidecar_before, redis_before) = (tree_cpu_ticks(sidecar_pid), tree_cpu_ticks(redis_pid));
    let generator_before = proc_stat(std::process::id()).cpu_ticks;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..READERS {
        let (f, counts, commits, writer, cache, latencies) = (
            f.clone(),
            counts.clone(),
            commits.clone(),
            writer.clone(),
            cache.clone(),
            latencies.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while started.elapsed() < run_for {
                let (pick, id, write) = {
                    let mut rng = rand::thread_rng();
                    (rng.gen_range(0..100u32), post_id(&mut rng), rng.gen_bool(0.05))
                };
                if write {
                    // The writer that bypasses Ferry: a title and version, or a comment.
                    let done = if pick % 2 == 0 {
                        writer
                            .query_one(
                                "UPDATE posts SET version = version + 1, title = 'edited ' || version \
                                 WHERE id = $1 RETURNING version",
                                &[&id],
                            )
                            .await
                            .map(|row| {
                                let v: i64 = row.get(0);
                                commits
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .entry(id)
                                    .or_default()
                                    .push((Instant::now(), v));
                            })
                    } else {
                        writer
                            .execute("INSERT INTO comments (post_id, body) VALUES ($1, 'new')", &[&id])
                            .await
                            .map(|_| ())
                    };
                    match done {
                        Ok(()) => counts.writes.fetch_add(1, Ordering::Relaxed),
                        Err(_) => counts.errors.fetch_add(1, Ordering::Relaxed),
                    };
                    continue;
                }
                let t = Instant::now();
                match one_read(&f, &cache, pick, id).await {
                    Ok(((status, age_ms), version)) => {
                        mine.push(t.elapsed());
                        counts.reads.fetch_add(1, Ordering::Relaxed);
                        counts.kind_reads[kind(pick)].fetch_add(1, Ordering::Relaxed);
                        if status == "hit" {
                            counts.hits.fetch_add(1, Ordering::Relaxed);
                            counts.kind_hits[kind(pick)].fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(v) = version {
                            if let Some((past, newer)) = stale(&commits, id, t, v) {
                                let n = counts.stale.fetch_add(1, Ordering::Relaxed);
                                // What a stale read was, for whoever investigates it.
                                if n < 20 {
                                    eprintln!(
                                        "blog: stale read of post {id}: version {v} ({status}, \
                                         {age_ms} ms old), {newer} committed; started {past:?} \
                                         past the bound"
                                    );
                                }
                            }
                        }
                    }
                    Err(_) => {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies.lock().unwrap_or_else(|p| p.into_inner()).extend(mine);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let secs = started.elapsed().as_secs_f64();
    let pg_ticks = tree_cpu_ticks(ctx.pg_pid).saturating_sub(pg_before);
    let sidecar_ticks = tree_cpu_ticks(sidecar_pid).saturating_sub(sidecar_before);
    let redis_ticks = tree_cpu_ticks(redis_pid).saturating_sub(redis_before);
    let generator_ticks = proc_stat(std::process::id())
        .cpu_ticks
        .saturating_sub(generator_before);
    let reads = counts.reads.load(Ordering::Relaxed);
    let hits = counts.hits.load(Ordering::Relaxed);
    let split = parts.since(ctx, sidecar_pid, reads).await;
    let samples = latencies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // Clock ticks are 10 ms: per read in microseconds.
    let per_read = |ticks: u64| (ticks as f64 * 100_000.0 / reads.max(1) as f64).round() / 10.0;
    let pg_us_per_read = pg_ticks as f64 * 10_000.0 / reads.max(1) as f64;
    let by_kind: serde_json::Map<String, Value> = KINDS
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (r, h) = (
                counts.kind_reads[i].load(Ordering::Relaxed),
                counts.kind_hits[i].load(Ordering::Relaxed),
            );
            let pct = (h as f64 * 1000.0 / r.max(1) as f64).round() / 10.0;
            (k.to_string(), json!(pct))
        })
        .collect();
    Measurement {
        scenario: "blog",
        rtt_ms: 0.0,
        path: format!("{name} [{}]", if pinned { "pinned" } else { "unpinned" }),
        latency: Some(Summary::of(&samples)),
        figures: json!({
            "reads_per_s": (reads as f64 / secs).round(),
            "hit_rate_pct": (hits as f64 * 1000.0 / reads.max(1) as f64).round() / 10.0,
            "pg_cpu_us_per_read": (pg_us_per_read * 10.0).round() / 10.0,
            "sidecar_cpu_us_per_read": per_read(sidecar_ticks),
            "redis_cpu_us_per_read": per_read(redis_ticks),
            "load_generator_cpu_us_per_read": per_read(generator_ticks),
            "pinned": pinned,
            "hit_rate_pct_by_read": by_kind,
            "cpu_us_per_read_apart": split,
            "stale_past_bound": counts.stale.load(Ordering::Relaxed),
            "writes": counts.writes.load(Ordering::Relaxed),
            "errors": counts.errors.load(Ordering::Relaxed),
        }),
    }
}

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let run_for = plan.throughput_for * 2;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let can_pin = cores >= 2
        && std::process::Command::new("taskset")
            .arg("-V")
            .output()
            .is_ok();
    if !can_pin {
        eprintln!("blog: pinned runs need 2 cores and taskset; unpinned only");
    }
    let redis_pid = super::scale::redis_pid(ctx).await.unwrap_or(0);
    let all = format!("0-{}", cores - 1);
    let mut out = Vec::new();
    for pinned in [true, false] {
        if pinned && !can_pin {
            continue;
        }
        // Postgres's backends already open are pinned with it; later ones inherit it.
        let mut servers = vec![
            ctx.sidecar_pid,
            ctx.ttl_sidecar_pid,
            ctx.changes_sidecar_pid,
            redis_pid,
        ];
        servers.extend(crate::env::tree_pids(ctx.pg_pid));
        let (servers_on, generator_on) = if pinned {
            ("1", "0")
        } else {
            (&all[..], &all[..])
        };
        super::pinned::pin(&servers, servers_on);
        super::pinned::pin(&[std::process::id()], generator_on);
        let how = (run_for, pinned);
        let label = if pinned { "pinned" } else { "unpinned" };
        ctx.step(&format!("blog: no cache ({label})"));
        let no_cache = (ctx.sidecar_addr, ctx.sidecar_pid);
        out.push(configuration(ctx, NO_CACHE, no_cache, Value::Null, how).await);
        ctx.step(&format!("blog: TTL only, Hyperdrive's defaults ({label})"));
        let ttl = json!({"ttl_s": 60, "swr_s": 15});
        let ttl_only = (ctx.ttl_sidecar_addr, ctx.ttl_sidecar_pid);
        out.push(configuration(ctx, TTL_ONLY, ttl_only, ttl, how).await);
        ctx.step(&format!("blog: Ferry, inferred ({label})"));
        let inferred = json!({"ttl_s": 60});
        let changes = (ctx.changes_sidecar_addr, ctx.changes_sidecar_pid);
        out.push(configuration(ctx, INFERRED, changes, inferred, how).await);
    }
    out
}

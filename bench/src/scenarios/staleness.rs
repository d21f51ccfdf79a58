//! Staleness after an external write: a writer that bypasses Ferry (a plain Postgres client,
//! as psql, a migration or another service would be) updates a row that is cached, while
//! readers read it through Ferry. Ferry with change-stream invalidation against Ferry with
//! TTLs only, set to Hyperdrive's defaults (max_age 60 s, stale-while-revalidate 15 s).
//! Meanwhile a background writer commits about 1,000 other rows a second, so the stream is
//! measured under load. Per round: warm the entry (a hit on both), commit the change, then
//! read through both sidecars every 2 ms for the window, noting which reads were stale.

use super::{Measurement, Plan};
use crate::ferry::Ferry;
use crate::stats::Summary;
use crate::Ctx;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Background commits per second while the rounds run (the load for the lag target).
const BACKGROUND_WRITES_PER_S: u64 = 1_000;
/// How often each configuration is read after the commit.
const POLL: Duration = Duration::from_millis(2);

pub const CHANGES: &str = "Ferry, change stream";
pub const TTL_ONLY: &str = "Ferry, TTL only (max_age 60 s, SWR 15 s)";

/// The row's name through one sidecar, and the cache status. The entry is named as the
/// `items` keyspace names row `id` (`items:<id>`), so the stream drops it when that row changes
/// and the background writes to other rows leave it alone (a read declaring the whole table
/// would be dropped by every one of them).
async fn read(f: &Ferry, id: i32) -> (String, String) {
    let body = json!({
        "sql": "SELECT name FROM items WHERE id = $1", "params": [id],
        "cache": {"ttl_s": 60, "swr_s": 15, "key": format!("items:{id}")},
    });
    match f.post("/v1/query", &body).await {
        Ok(v) => (
            v["rows"][0]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            v["cache"].as_str().unwrap_or_default().to_string(),
        ),
        Err(e) => (format!("error: {e}"), String::new()),
    }
}

async fn warm(f: &Ferry, id: i32) {
    let mut last = (String::new(), String::new());
    for _ in 0..400 {
        last = read(f, id).await;
        if last.1 == "hit" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("row {id} never became a cache hit (last read: {last:?})");
}

/// One configuration's reads over all rounds.
#[derive(Default)]
struct Totals {
    fresh_times: Vec<Duration>,
    reads: u64,
    stale: u64,
    points: Vec<(f64, bool)>,
}

/// What the reads through one configuration saw after one commit.
#[derive(Default)]
struct Seen {
    reads: u64,
    stale: u64,
    first_fresh: Option<Duration>,
    /// (ms since the commit, stale) of every read, for the chart.
    points: Vec<(f64, bool)>,
}

async fn watch_until(
    f: &Ferry,
    id: i32,
    fresh: &str,
    committed: Instant,
    window: Duration,
) -> Seen {
    let mut seen = Seen::default();
    while committed.elapsed() < window {
        let (name, _) = read(f, id).await;
        // When the answer arrived: "commit to first fresh read" counts the read itself.
        let at = committed.elapsed();
        let stale = name != fresh;
        seen.reads += 1;
        seen.stale += u64::from(stale);
        seen.points.push((at.as_secs_f64() * 1000.0, stale));
        if !stale && seen.first_fresh.is_none() {
            seen.first_fresh = Some(at);
        }
        tokio::time::sleep(POLL).await;
    }
    seen
}

/// Background commits on rows 101..=1000 at a steady rate; returns the count made.
fn background_writer(ctx: &Ctx, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let done = Arc::new(AtomicU64::new(0));
    let conns = 2u64;
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (stop, done) = (stop.clone(), done.clone());
        let conn = super::pg_conninfo(ctx);
        tasks.push(tokio::spawn(async move {
            let Ok((client, connection)) =
                tokio_postgres::connect(&conn, tokio_postgres::NoTls).await
            else {
                return;
            };
            tokio::spawn(connection);
            let mut tick = tokio::time::interval(Duration::from_micros(
                1_000_000 * conns / BACKGROUND_WRITES_PER_S,
            ));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut id = 101 + c as i32;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                if client
                    .execute("UPDATE items SET price = price + 1 WHERE id = $1", &[&id])
                    .await
                    .is_ok()
                {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                id = if id + 2 > 1000 {
                    101 + c as i32
                } else {
                    id + 2
                };
            }
        }));
    }
    tokio::spawn(async move {
        for t in tasks {
            let _ = t.await;
        }
        done.load(Ordering::Relaxed)
    })
}

/// The share of stale reads per 10 ms after the commit: `[[from_ms, pct], ...]` (the chart).
fn buckets(points: &[(f64, bool)], window: Duration) -> Vec<Value> {
    let n = (window.as_millis() / 10) as usize;
    let mut count = vec![(0u64, 0u64); n.max(1)];
    for (ms, stale) in points {
        let b = ((*ms / 10.0) as usize).min(count.len() - 1);
        count[b].0 += 1;
        count[b].1 += u64::from(*stale);
    }
    count
        .iter()
        .enumerate()
        .filter(|(_, (reads, _))| *reads > 0)
        .map(|(i, (reads, stale))| {
            json!([
                i * 10,
                (*stale as f64 * 1000.0 / *reads as f64).round() / 10.0
            ])
        })
        .collect()
}

pub async fn run(ctx: &Ctx, plan: &Plan) -> Vec<Measurement> {
    let changes = Ferry::new(format!("http://{}", ctx.changes_sidecar_addr), 4);
    let ttl = Ferry::new(format!("http://{}", ctx.ttl_sidecar_addr), 4);
    let writer = super::pg_client(ctx).await;
    let rounds = if plan.samples > 100 { 40 } else { 5 };
    // The stream's first session makes the slot and replays: wait until reads may use the cache.
    let ready = format!("http://{}/readyz", ctx.changes_sidecar_addr);
    for _ in 0..300 {
        let state = match reqwest::get(&ready).await {
            Ok(r) => r.json::<Value>().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        if state["changes"]["state"] == "caught_up" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let window = Duration::from_millis(if plan.samples > 100 { 1_000 } else { 500 });

    ctx.step("staleness: background writes, then external writes under watch");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let background = background_writer(ctx, stop.clone());
    let mut per: [Totals; 2] = Default::default();
    for r in 0..rounds {
        let id = 1 + r;
        warm(&changes, id).await;
        warm(&ttl, id).await;
        let fresh = format!("external write {r}");
        writer
            .execute("UPDATE items SET name = $1 WHERE id = $2", &[&fresh, &id])
            .await
            .expect("external write");
        let committed = Instant::now();
        let (a, b) = tokio::join!(
            watch_until(&changes, id, &fresh, committed, window),
            watch_until(&ttl, id, &fresh, committed, window),
        );
        for (slot, seen) in per.iter_mut().zip([a, b]) {
            if let Some(t) = seen.first_fresh {
                slot.fresh_times.push(t);
            }
            slot.reads += seen.reads;
            slot.stale += seen.stale;
            slot.points.extend(seen.points);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = background.await.unwrap_or(0);
    let writes_per_s = writes as f64 / started.elapsed().as_secs_f64();

    // One round of the TTL-only configuration waited out, in the full run: how long its
    // readers actually see the old row (about the TTL, then one stale read while SWR refreshes).
    let mut ttl_first_fresh_s = Value::Null;
    if plan.samples > 100 {
        ctx.step("staleness: one TTL-only round waited out (up to 80 s)");
        let id = 900;
        warm(&ttl, id).await;
        let fresh = "external write, waited out".to_string();
        writer
            .execute("UPDATE items SET name = $1 WHERE id = $2", &[&fresh, &id])
            .await
            .expect("external write");
        let committed = Instant::now();
        while committed.elapsed() < Duration::from_secs(80) {
            if read(&ttl, id).await.0 == fresh {
                ttl_first_fresh_s =
                    json!((committed.elapsed().as_secs_f64() * 10.0).round() / 10.0);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let mut out = Vec::new();
    for (i, name) in [CHANGES, TTL_ONLY].into_iter().enumerate() {
        let Totals {
            fresh_times,
            reads,
            stale,
            points,
        } = &per[i];
        out.push(Measurement {
            scenario: "staleness",
            rtt_ms: 0.0,
            path: name.to_string(),
            latency: (!fresh_times.is_empty()).then(|| Summary::of(fresh_times)),
            figures: json!({
                "rounds": rounds,
                "window_ms": window.as_millis() as u64,
                "fresh_within_window": fresh_times.len(),
                "reads": reads,
                "stale_reads": stale,
                "stale_share_pct": if *reads == 0 { 0.0 } else { (*stale as f64 * 1000.0 / *reads as f64).round() / 10.0 },
                "background_writes_per_s": writes_per_s.round(),
                "first_fresh_waited_out_s": if i == 1 { ttl_first_fresh_s.clone() } else { Value::Null },
                "stale_pct_by_ms": buckets(points, window),
            }),
        });
    }
    out
}

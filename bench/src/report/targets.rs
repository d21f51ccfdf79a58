//! The issues' targets, each checked against this run's figures.

use super::Report;
use crate::scenarios::Measurement;

/// A target from the issue, checked against this run.
pub struct Target {
    pub name: String,
    pub met: bool,
    pub detail: String,
}

impl Report {
    pub(super) fn find(&self, scenario: &str, rtt: f64, path_starts: &str) -> Option<&Measurement> {
        self.measurements.iter().find(|m| {
            m.scenario == scenario
                && (m.rtt_ms - rtt).abs() < 1e-9
                && m.path.starts_with(path_starts)
        })
    }

    pub(super) fn avg(&self, scenario: &str, rtt: f64, path: &str) -> Option<f64> {
        self.find(scenario, rtt, path)
            .and_then(|m| m.latency.as_ref())
            .map(|l| l.avg_ms)
    }

    pub(super) fn p50(&self, scenario: &str, rtt: f64, path: &str) -> Option<f64> {
        self.find(scenario, rtt, path)
            .and_then(|m| m.latency.as_ref())
            .map(|l| l.p50_ms)
    }

    /// The peer's figure across the same 5 ms link, for a target's detail: webdis, kept alive,
    /// pays the same one round trip and wake-ups as Ferry (empty if the run has no such row).
    fn webdis_at_5ms(
        &self,
        show: impl Fn(f64) -> String,
        pick: impl Fn(&crate::stats::Summary) -> f64,
    ) -> String {
        self.find("redis", 5.0, "webdis")
            .and_then(|m| m.latency.as_ref())
            .map_or_else(String::new, |l| {
                format!(
                    "; webdis kept alive across the same link: {}",
                    show(pick(l))
                )
            })
    }

    pub fn targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        let mut push = |name: &str, v: Option<(bool, String)>| {
            if let Some((met, detail)) = v {
                t.push(Target {
                    name: name.into(),
                    met,
                    detail,
                });
            }
        };
        push(
            "redis @5 ms: Ferry mean <= 1/3 of direct",
            (|| {
                let (d, f) = (
                    self.avg("redis", 5.0, "direct")?,
                    self.avg("redis", 5.0, "Ferry")?,
                );
                Some((
                    f * 3.0 <= d,
                    format!(
                        "Ferry {f:.2} ms vs direct {d:.2} ms: {:.2}x{}",
                        d / f,
                        self.webdis_at_5ms(|w| format!("{:.2}x ({w:.2} ms)", d / w), |l| l.avg_ms)
                    ),
                ))
            })(),
        );
        push(
            "redis @5 ms with TLS: Ferry over HTTPS mean <= 1/3 of direct TLS",
            (|| {
                let (d, f) = (
                    self.avg("redis", 5.0, "direct TLS")?,
                    self.avg("redis", 5.0, "Ferry over HTTPS")?,
                );
                Some((
                    f * 3.0 <= d,
                    format!("Ferry {f:.2} ms vs direct {d:.2} ms: {:.2}x", d / f),
                ))
            })(),
        );
        push(
            "redis @5 ms: Ferry p50 <= RTT + 0.5 ms",
            (|| {
                let p = self.p50("redis", 5.0, "Ferry")?;
                Some((
                    p <= 5.5,
                    format!(
                        "p50 {p:.2} ms{}",
                        self.webdis_at_5ms(|w| format!("p50 {w:.2} ms"), |l| l.p50_ms)
                    ),
                ))
            })(),
        );
        push(
            "postgres @5 ms: Ferry uncached mean <= 1/2 of direct",
            (|| {
                let (d, f) = (
                    self.avg("postgres", 5.0, "direct")?,
                    self.avg("postgres", 5.0, "Ferry uncached")?,
                );
                Some((
                    f * 2.0 <= d,
                    format!("Ferry {f:.2} ms vs direct {d:.2} ms: {:.2}x", d / f),
                ))
            })(),
        );
        push(
            "postgres @5 ms with TLS: Ferry uncached over HTTPS mean <= 1/2 of direct TLS",
            (|| {
                let (d, f) = (
                    self.avg("postgres", 5.0, "direct TLS")?,
                    self.avg("postgres", 5.0, "Ferry uncached over HTTPS")?,
                );
                Some((
                    f * 2.0 <= d,
                    format!("Ferry {f:.2} ms vs direct {d:.2} ms: {:.2}x", d / f),
                ))
            })(),
        );
        push(
            "postgres @5 ms: Ferry cached p50 <= RTT + 0.5 ms",
            (|| {
                let p = self.p50("postgres", 5.0, "Ferry cached")?;
                Some((p <= 5.5, format!("p50 {p:.2} ms")))
            })(),
        );
        for size in ["100 B", "50 KB"] {
            push(
                &format!("keys {size} @1 ms: batch >= 20x sequential, >= 3x 10 concurrent"),
                (|| {
                    let s = self.avg("keys", 1.0, &format!("{size}: 100 sequential"))?;
                    let c = self.avg("keys", 1.0, &format!("{size}: 10 concurrent"))?;
                    let b = self.avg("keys", 1.0, &format!("{size}: one batch"))?;
                    Some((
                        s / b >= 20.0 && c / b >= 3.0,
                        format!(
                            "batch {b:.2} ms: {:.1}x sequential, {:.1}x concurrent",
                            s / b,
                            c / b
                        ),
                    ))
                })(),
            );
        }
        push(
            "connections: 0 errors through Ferry, peak Redis clients <= pool (8)",
            (|| {
                let m = self.find("connections", 5.0, "Ferry")?;
                let (e, p) = (
                    m.figures["errors"].as_u64()?,
                    m.figures["peak_redis_clients"].as_u64()?,
                );
                let d = self.find("connections", 5.0, "direct")?.figures["errors"].as_u64()?;
                Some((
                    e == 0 && p <= 8,
                    format!("Ferry: {e} errors, peak {p} clients; direct: {d} errors"),
                ))
            })(),
        );
        push(
            "replay store: 0 refusals at full signed load, RSS flat after the first window",
            (|| {
                let m = self.measurements.iter().find(|m| m.scenario == "replay")?;
                let f = &m.figures;
                let refused = f["refused"].as_u64()?;
                let (filled, max) = (
                    f["rss_window_filled_mb"].as_f64()?,
                    f["rss_max_after_mb"].as_f64()?,
                );
                Some((
                    refused == 0 && max <= filled * 1.25 + 4.0,
                    format!(
                        "{} rps, {refused} refused; RSS {filled:.1} MB when the window filled, \
                         at most {max:.1} MB after; ~{} bytes per request/s",
                        f["rps"], f["bytes_per_request_per_s"]
                    ),
                ))
            })(),
        );
        let tp =
            |path: &str, figure: &str| self.find("throughput", 0.0, path)?.figures[figure].as_f64();
        push(
            "throughput: signed cache GET >= webdis, sidecar CPU per 1,000 <= webdis's",
            (|| {
                let (f, w) = (
                    tp("cache GET: Ferry", "rps")?,
                    tp("cache GET: webdis", "rps")?,
                );
                let fc = tp("cache GET: Ferry", "server_cpu_ms_per_1k")?;
                let wc = tp("cache GET: webdis", "server_cpu_ms_per_1k")?;
                Some((
                    f >= w && fc <= wc,
                    format!(
                        "Ferry {f:.0} rps vs webdis {w:.0} rps ({:.2}x); CPU per 1,000: \
                         {fc:.1} ms vs {wc:.1} ms",
                        f / w
                    ),
                ))
            })(),
        );
        push(
            "throughput: /v1/query hit >= webdis",
            (|| {
                let (f, w) = (
                    tp("query: Ferry cached", "rps")?,
                    tp("cache GET: webdis", "rps")?,
                );
                Some((f >= w, format!("{f:.0} rps vs {w:.0} rps ({:.2}x)", f / w)))
            })(),
        );
        // A Ferry path's requests/s against a share of pgbench -S's transactions/s.
        let of_pgbench = |path: &str, share: f64| {
            let (f, p) = (tp(path, "rps")?, tp("query: pgbench", "rps")?);
            Some((
                f >= share * p,
                format!("{f:.0} rps vs {p:.0} tps ({:.2}x)", f / p),
            ))
        };
        push(
            "throughput: uncached named query (found plain: no reset) >= 0.6x pgbench -S",
            of_pgbench("query: Ferry uncached named query", 0.6),
        );
        push(
            "throughput: uncached raw SQL /v1/query >= 0.35x pgbench -S",
            of_pgbench("query: Ferry uncached (/v1/query", 0.35),
        );
        push(
            "throughput: Neon /sql uncached >= 0.9x /v1/query uncached raw SQL",
            (|| {
                let (n, v) = (
                    tp("query: Ferry uncached (/sql", "rps")?,
                    tp("query: Ferry uncached (/v1/query", "rps")?,
                );
                Some((
                    n >= 0.9 * v,
                    format!("{n:.0} rps vs {v:.0} rps ({:.2}x)", n / v),
                ))
            })(),
        );
        // Pinned (wrk on core 0, every server on core 1): Ferry against its peers.
        let pin = |path: &str, figure: &str| {
            self.measurements
                .iter()
                .find(|m| {
                    m.scenario == "pinned"
                        && m.path.starts_with(path)
                        && m.path.ends_with("[pinned]")
                })?
                .figures[figure]
                .as_f64()
        };
        let over_webdis = |path: &str, times: f64, cpu: bool| {
            let (f, w) = (pin(path, "rps")?, pin("cache GET: webdis", "rps")?);
            let (fc, wc) = (
                pin(path, "server_cpu_us")?,
                pin("cache GET: webdis", "server_cpu_us")?,
            );
            Some((
                f >= times * w && (!cpu || fc <= wc),
                format!(
                    "{f:.0} rps vs webdis {w:.0} ({:.2}x); server CPU {fc:.1} vs {wc:.1} µs per request",
                    f / w
                ),
            ))
        };
        push(
            "pinned: signed cache GET >= 1.25x webdis, server CPU per request <= webdis's",
            over_webdis("cache GET: Ferry (/v1/cache", 1.25, true),
        );
        push(
            "pinned: /v1/query hit >= 1.25x webdis, server CPU per request <= webdis's",
            over_webdis("query: Ferry cached", 1.25, true),
        );
        push(
            "pinned: Upstash-compatible GET >= 1.5x webdis",
            over_webdis("cache GET: Ferry (Upstash", 1.5, false),
        );
        let of_pgbench_pinned = |path: &str, share: f64| {
            let (f, p) = (pin(path, "rps")?, pin("query: pgbench", "rps")?);
            Some((
                f >= share * p,
                format!("{f:.0} rps vs {p:.0} tps ({:.2}x)", f / p),
            ))
        };
        push(
            "pinned: uncached named query >= 0.6x pgbench -S",
            of_pgbench_pinned("query: Ferry uncached named query", 0.6),
        );
        push(
            "pinned: uncached raw SQL >= 0.35x pgbench -S",
            of_pgbench_pinned("query: Ferry uncached (/v1/query", 0.35),
        );
        push(
            "one client, 0 RTT: hit p50 <= webdis p50 + 0.05 ms, miss p50 <= floor + 0.1 ms",
            (|| {
                let w = self.p50("one client", 0.0, "webdis GET")?;
                let g = self.p50("one client", 0.0, "Ferry signed cache GET")?;
                let h = self.p50("one client", 0.0, "Ferry /v1/query hit")?;
                let m = self.p50("one client", 0.0, "Ferry /v1/query miss")?;
                let named = self
                    .p50("one client", 0.0, "Ferry named query miss")
                    .map(|n| format!("; the same miss as a named query {n:.3} ms"))
                    .unwrap_or_default();
                // The point SELECT, not the UPDATE row before it (same prefix).
                let d = self.p50("one client", 0.0, "Postgres direct (")?;
                Some((
                    g <= w + 0.05 && h <= w + 0.05 && m <= w + d + 0.1,
                    // A read-through miss cannot cost less than an HTTP cache lookup (what
                    // webdis's GET is) plus the query: the floor any such design starts from.
                    format!(
                        "p50: cache GET {g:.3} / query hit {h:.3} vs webdis {w:.3} ms; \
                         miss {m:.3} vs Postgres {d:.3} ms (floor of a read-through miss: \
                         webdis GET + Postgres = {:.3}){named}",
                        w + d
                    ),
                ))
            })(),
        );
        push(
            "sidecar RSS <= 64 MB in every scenario, 2,000 connections answered",
            (|| {
                let conns = self
                    .measurements
                    .iter()
                    .find(|m| m.path.contains("open connections"))?;
                let (n, ok) = (
                    conns.figures["connections"].as_u64()?,
                    conns.figures["ok"].as_u64()?,
                );
                let worst = self
                    .resources
                    .iter()
                    .max_by(|a, b| a.peak_rss_mb.total_cmp(&b.peak_rss_mb))?;
                Some((
                    worst.peak_rss_mb <= 64.0 && ok == n,
                    format!(
                        "peak {:.1} MB ({}); {ok} of {n} connections answered, {} MB held",
                        worst.peak_rss_mb, worst.scenario, conns.figures["rss_held_mb"]
                    ),
                ))
            })(),
        );
        push(
            "Upstash-compatible GET >= webdis requests/s",
            (|| {
                let u = self.find("throughput", 0.0, "cache GET: Ferry (Upstash")?;
                let w = self.find("throughput", 0.0, "cache GET: webdis")?;
                let (u, w) = (u.figures["rps"].as_f64()?, w.figures["rps"].as_f64()?);
                Some((u >= w, format!("{u:.0} vs webdis {w:.0}: {:.2}x", u / w)))
            })(),
        );
        push(
            "staleness: change stream, commit -> first fresh read p99 <= 50 ms at ~1,000 writes/s",
            (|| {
                let m = self.find("staleness", 0.0, crate::scenarios::staleness::CHANGES)?;
                let l = m.latency.as_ref()?;
                let ttl = self.find("staleness", 0.0, crate::scenarios::staleness::TTL_ONLY)?;
                Some((
                    l.p99_ms <= 50.0 && m.figures["fresh_within_window"] == m.figures["rounds"],
                    format!(
                        "p50 {:.1} / p99 {:.1} / max {:.1} ms at {} writes/s; stale reads {}% \
                         (TTL only: {}%)",
                        l.p50_ms,
                        l.p99_ms,
                        l.max_ms,
                        m.figures["background_writes_per_s"],
                        m.figures["stale_share_pct"],
                        ttl.figures["stale_share_pct"]
                    ),
                ))
            })(),
        );
        t
    }
}

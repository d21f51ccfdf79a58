//! `ferry-bench`: reproduces, on one machine, the measurements Ferry exists for (see
//! ../shared/DESIGN.md and README "Performance"), with Ferry in place of the proxy.
//! A latency proxy stands in for the edge <-> data centre link. Run through scripts/bench.sh,
//! which installs webdis, wrk and redis-tools and builds the release sidecar.

mod env;
mod ferry;
mod precise_sleep;
mod proxy;
mod report;
mod resp;
mod scenarios;
mod stats;
mod tls;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use scenarios::{Measurement, Plan, Resources};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Ferry's benchmarks: direct vs through Ferry, over a simulated wide-area link")]
struct Args {
    #[command(subcommand)]
    scenario: Option<Which>,
    /// A smoke run: few samples, short loads (under a minute).
    #[arg(long)]
    quick: bool,
    /// Where result files go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
}

#[derive(Subcommand, Clone, Copy, PartialEq, Eq)]
enum Which {
    /// A cached GET: fresh connection + AUTH per request vs Ferry.
    Redis,
    /// A point query: fresh connection + auth vs Ferry uncached vs Ferry cached.
    Postgres,
    /// 100 keys: sequential vs 10 concurrent connections vs one batch; 100 B and 50 KB values.
    Keys,
    /// 500 concurrent isolates against a Redis capped at 30 clients.
    Connections,
    /// Requests per second: Ferry vs webdis vs redis-benchmark; /v1/query vs pgbench -S.
    Throughput,
    /// The same with the load generator (wrk, pgbench) on core 0 and the servers on core 1,
    /// then unpinned: requests/s and each side's CPU per request.
    Pinned,
    /// One client at 0 RTT, each path in turn (also part of `throughput`): a fixed number of
    /// requests, so a run under `valgrind --tool=callgrind` counts instructions per request.
    OneClient,
    /// The replay store at full signed load for three clock windows: 0 refusals, RSS flat.
    Replay,
    /// Staleness after a write that bypasses Ferry: change-stream invalidation vs TTLs only.
    Staleness,
    /// One sidecar vs two, replay store local vs shared: requests/s and CPU per request.
    Scale,
    /// A blog's mix (95% reads, 5% writes that bypass Ferry): no cache, TTL only, inferred.
    Blog,
}

/// What the scenarios need: addresses, passwords, progress.
pub struct Ctx {
    /// URLs the scenarios' own sidecars connect with.
    pub redis_url: String,
    pub pg_url: String,
    pub redis_addr: SocketAddr,
    pub redis_password: String,
    pub pg_addr: SocketAddr,
    pub pg_password: String,
    pub pg_pid: u32,
    pub sidecar_addr: SocketAddr,
    /// The same sidecar build serving HTTPS (certificate from `tls`).
    pub https_sidecar_addr: SocketAddr,
    /// Redis' TLS port (same server, same data as `redis_addr`).
    pub redis_tls_addr: SocketAddr,
    pub tls: tls::BenchTls,
    pub sidecar_pid: u32,
    pub limited_redis_addr: SocketAddr,
    pub limited_sidecar_addr: SocketAddr,
    pub webdis_addr: SocketAddr,
    pub webdis_pid: u32,
    /// A sidecar with a short clock window, for the replay-store scenario.
    pub replay_sidecar_addr: SocketAddr,
    pub replay_sidecar_pid: u32,
    pub replay_skew_s: u64,
    /// A sidecar with change-stream invalidation on, and one with TTLs only (its own prefix).
    pub changes_sidecar_addr: SocketAddr,
    pub ttl_sidecar_addr: SocketAddr,
    /// Their pids (each configuration's own CPU per read in `blog`).
    pub changes_sidecar_pid: u32,
    pub ttl_sidecar_pid: u32,
    pub progress: ProgressBar,
}

impl Ctx {
    pub fn step(&self, what: &str) {
        self.progress.inc(1);
        self.progress.set_message(what.to_string());
    }
}

fn steps(which: Which) -> u64 {
    match which {
        Which::Redis => 15,
        Which::Postgres => 15,
        Which::Keys => 6,
        Which::Connections => 2,
        Which::Throughput => 10,
        Which::Pinned => 14,
        Which::OneClient => 1,
        Which::Replay => 1,
        Which::Staleness => 2,
        Which::Scale => 4,
        Which::Blog => 3,
    }
}

fn main() {
    let args = Args::parse();
    let selected: Vec<Which> = match args.scenario {
        Some(w) => vec![w],
        None => vec![
            Which::Redis,
            Which::Postgres,
            Which::Keys,
            Which::Connections,
            Which::Throughput,
            Which::Pinned,
            Which::Replay,
            Which::Staleness,
            Which::Scale,
            Which::Blog,
        ],
    };
    let plan = Plan::new(args.quick);
    let started = Instant::now();

    eprintln!("starting private Redis (password), Redis (maxclients 30), Postgres (SCRAM), the sidecar, webdis...");
    // One CA for the TLS baselines: Redis also listens with TLS, Postgres accepts TLS, and one
    // more sidecar serves HTTPS.
    let tls = tls::BenchTls::make();
    let redis_tls_port = ferry_testkit::free_port().to_string();
    let redis = ferry_testkit::RedisServer::start_with_args(&[
        "--requirepass",
        env::REDIS_PASSWORD,
        "--tls-port",
        &redis_tls_port,
        "--tls-cert-file",
        &tls.cert,
        "--tls-key-file",
        &tls.key,
        "--tls-ca-cert-file",
        &tls.ca,
        "--tls-auth-clients",
        "no",
    ]);
    let limited = ferry_testkit::RedisServer::start_with_args(&[
        "--requirepass",
        env::REDIS_PASSWORD,
        "--maxclients",
        "30",
    ]);
    let (pg, pg_url) = env::start_postgres();
    pg.enable_ssl(&tls.cert, &tls.key);
    // As many Postgres connections as pgbench gets clients, for a like-for-like comparison.
    let pg_pool = std::env::var("FERRY_BENCH_PG_POOL").unwrap_or(plan.concurrency.to_string());
    let sidecar = env::start_sidecar(
        &redis.url(),
        &pg_url,
        &[("FERRY_POSTGRES_POOL_SIZE", pg_pool.as_str())],
    );
    let limited_sidecar = env::start_sidecar(&limited.url(), &pg_url, &[]);
    // A short window so that it fills and turns over several times within the run.
    let replay_skew_s: u64 = if args.quick { 2 } else { 10 };
    let replay_sidecar = env::start_sidecar(
        &redis.url(),
        &pg_url,
        &[("FERRY_AUTH_MAX_SKEW_S", &replay_skew_s.to_string())],
    );
    let https_sidecar = env::start_sidecar(
        &redis.url(),
        &pg_url,
        &[
            ("FERRY_SERVER_TLS_CERT_PATH", tls.cert.as_str()),
            ("FERRY_SERVER_TLS_KEY_PATH", tls.key.as_str()),
        ],
    );
    let changes_sidecar = env::start_sidecar(
        &redis.url(),
        &pg_url,
        &[
            ("FERRY_CHANGES_ENABLED", "true"),
            ("FERRY_CHANGES_TABLES", scenarios::blog::TABLES),
            // Its own keys: a new change stream starts by moving its cache's epoch, which
            // would turn the other sidecars' entries into misses mid-scenario.
            ("FERRY_CACHE_KEY_PREFIX", "changes:"),
        ],
    );
    let ttl_sidecar = env::start_sidecar(
        &redis.url(),
        &pg_url,
        &[("FERRY_CACHE_KEY_PREFIX", "ttl-only:")],
    );
    let webdis_dir =
        std::env::temp_dir().join(format!("ferry-bench-webdis-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&webdis_dir);
    let webdis = env::start_webdis(&redis, &webdis_dir);

    let progress = ProgressBar::new(selected.iter().map(|w| steps(*w)).sum::<u64>() + 1);
    progress.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let ctx = Ctx {
        redis_url: redis.url(),
        pg_url: pg_url.clone(),
        redis_addr: ([127, 0, 0, 1], redis.port).into(),
        redis_password: env::REDIS_PASSWORD.into(),
        pg_addr: ([127, 0, 0, 1], pg.port).into(),
        pg_password: env::PG_PASSWORD.into(),
        pg_pid: pg.postmaster_pid().unwrap_or(0),
        sidecar_addr: sidecar.addr,
        https_sidecar_addr: https_sidecar.addr,
        redis_tls_addr: ([127, 0, 0, 1], redis_tls_port.parse().unwrap_or(0)).into(),
        tls,
        sidecar_pid: sidecar.pid(),
        limited_redis_addr: ([127, 0, 0, 1], limited.port).into(),
        limited_sidecar_addr: limited_sidecar.addr,
        webdis_addr: webdis.addr,
        webdis_pid: webdis.pid(),
        replay_sidecar_addr: replay_sidecar.addr,
        replay_sidecar_pid: replay_sidecar.pid(),
        replay_skew_s,
        changes_sidecar_addr: changes_sidecar.addr,
        ttl_sidecar_addr: ttl_sidecar.addr,
        changes_sidecar_pid: changes_sidecar.pid(),
        ttl_sidecar_pid: ttl_sidecar.pid(),
        progress,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let (measurements, resources, overhead) = rt.block_on(async {
        ctx.step("measuring the latency proxy's own cost");
        let overhead = proxy_overhead(&ctx).await;
        let mut all: Vec<Measurement> = Vec::new();
        let mut res: Vec<Resources> = Vec::new();
        let pid = sidecar.pid();
        for w in &selected {
            let (m, r) = match w {
                Which::Redis => {
                    scenarios::watch("redis", pid, scenarios::redis::run(&ctx, &plan)).await
                }
                Which::Postgres => {
                    scenarios::watch("postgres", pid, scenarios::postgres::run(&ctx, &plan)).await
                }
                Which::Keys => {
                    scenarios::watch("keys", pid, scenarios::keys::run(&ctx, &plan)).await
                }
                Which::Connections => {
                    scenarios::watch(
                        "connections",
                        limited_sidecar.pid(),
                        scenarios::connections::run(&ctx, &plan),
                    )
                    .await
                }
                Which::Throughput => {
                    scenarios::watch("throughput", pid, scenarios::throughput::run(&ctx, &plan))
                        .await
                }
                Which::Pinned => {
                    scenarios::watch("pinned", pid, scenarios::pinned::run(&ctx, &plan)).await
                }
                Which::OneClient => {
                    scenarios::watch("one client", pid, scenarios::one_client::run(&ctx, &plan))
                        .await
                }
                Which::Staleness => {
                    scenarios::watch(
                        "staleness",
                        changes_sidecar.pid(),
                        scenarios::staleness::run(&ctx, &plan),
                    )
                    .await
                }
                Which::Scale => {
                    scenarios::watch("scale", pid, scenarios::scale::run(&ctx, &plan)).await
                }
                Which::Blog => {
                    scenarios::watch(
                        "blog",
                        changes_sidecar.pid(),
                        scenarios::blog::run(&ctx, &plan),
                    )
                    .await
                }
                Which::Replay => {
                    let rpid = replay_sidecar.pid();
                    let (m, r) =
                        scenarios::watch("replay", rpid, scenarios::replay::run(&ctx, &plan)).await;
                    (m, scenarios::replay::resources(rpid, &r))
                }
            };
            all.extend(m);
            res.push(r);
        }
        (all, res, overhead)
    });
    ctx.progress
        .finish_with_message(format!("done in {:.0} s", started.elapsed().as_secs_f64()));

    let report = report::Report {
        date: chrono::Local::now().format("%Y-%m-%d %H:%M %Z").to_string(),
        quick: args.quick,
        machine: env::machine(),
        proxy_overhead_ms: overhead,
        measurements,
        resources,
    };
    let md = report.markdown();
    println!("\n{md}");
    if let Err(e) = write(&args.out, &report, &md) {
        eprintln!("could not write results to {}: {e}", args.out.display());
        std::process::exit(1);
    }
    drop((
        webdis,
        sidecar,
        limited_sidecar,
        replay_sidecar,
        changes_sidecar,
        ttl_sidecar,
        pg,
        redis,
        limited,
    ));
    let _ = std::fs::remove_dir_all(&webdis_dir);
}

/// Files: <stamp>.md/.json, and latest.md / latest.json / latency.svg / staleness.svg.
fn write(out: &std::path::Path, report: &report::Report, md: &str) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let stamp = chrono::Local::now().format("%Y-%m-%d-%H%M").to_string();
    let suffix = if report.quick { "-quick" } else { "" };
    let json = serde_json::to_string_pretty(&report.json()).map_err(|e| e.to_string())?;
    for name in [format!("{stamp}{suffix}"), format!("latest{suffix}")] {
        std::fs::write(out.join(format!("{name}.md")), md).map_err(|e| e.to_string())?;
        std::fs::write(out.join(format!("{name}.json")), &json).map_err(|e| e.to_string())?;
    }
    report.chart(&out.join(format!("latency{suffix}.svg")))?;
    report.staleness_chart(&out.join(format!("staleness{suffix}.svg")))?;
    env::remove_config_file();
    eprintln!("results written to {}", out.display());
    Ok(())
}

/// The proxy's own cost: a PING round trip through it at 0 ms delay, minus one without it.
async fn proxy_overhead(ctx: &Ctx) -> f64 {
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v.get(v.len() / 2)
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1000.0
    };
    let measure = |addr: SocketAddr| async move {
        let mut c = resp::Conn::connect(addr).await.ok()?;
        c.cmd(&[b"AUTH", env::REDIS_PASSWORD.as_bytes()])
            .await
            .ok()?;
        let mut v = Vec::new();
        for _ in 0..300 {
            let t = Instant::now();
            c.cmd(&[b"PING"]).await.ok()?;
            v.push(t.elapsed());
        }
        Some(v)
    };
    let direct = measure(ctx.redis_addr).await.unwrap_or_default();
    let Ok(proxy) = proxy::LatencyProxy::start(ctx.redis_addr, Duration::ZERO).await else {
        return 0.0;
    };
    let via = measure(proxy.addr).await.unwrap_or_default();
    (p50(via) - p50(direct)).max(0.0)
}

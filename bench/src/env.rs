//! The bench's private world: Redis with a password, Postgres with SCRAM auth (demo data and
//! pgbench tables), the release sidecar as its own process (so its RSS and CPU are its own),
//! and webdis. Nothing here touches the machine's shared services.

use ferry_testkit::{free_port, wait_until, PgServer, RedisServer};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const SECRET: &str = "bench-secret-0123456789abcdef";
pub const REDIS_PASSWORD: &str = "bench-redis-pass";
pub const PG_PASSWORD: &str = "bench-pg-pass";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target"))
}

/// The bench's point read as a named query: `pgbench -S`'s statement, which Postgres finds
/// plain (it calls no volatile function), so it runs with no session reset after it (the
/// default for named reads).
pub const POINT_READ: &str = "bench_point_read";

/// deploy/ferry.toml with [`POINT_READ`] added, written once per bench run.
fn config_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let base = std::fs::read_to_string(repo_root().join("deploy/ferry.toml"))
            .expect("read deploy/ferry.toml");
        let file = std::env::temp_dir().join(format!("ferry-bench-{}.toml", std::process::id()));
        let extra = format!(
            "\n[queries.{POINT_READ}]\n\
             sql = \"SELECT abalance FROM pgbench_accounts WHERE aid = $1\"\n"
        );
        std::fs::write(&file, base + &extra).expect("write the bench's config");
        file
    })
    .clone()
}

/// Removes the config file [`config_file`] wrote (at the end of the run).
pub fn remove_config_file() {
    let _ = std::fs::remove_file(config_file());
}

/// A process we started; killed on drop.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the release sidecar binary against these stores.
/// The bench sidecars' Upstash token (namespace "default:").
pub const UPSTASH_TOKEN: &str = "bench-upstash-token-0123456789abcdef0123";
/// The bench sidecars' Neon token (the password of the `/sql` connection string).
pub const NEON_TOKEN: &str = "bench-neon-token-0123456789abcdef01234567";

pub fn start_sidecar(redis_url: &str, pg_url: &str, extra: &[(&str, &str)]) -> Proc {
    let bin = std::env::var("FERRY_SIDECAR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| target_dir().join("release/ferry-sidecar"));
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --release -p ferry-sidecar` (scripts/bench.sh does)",
        bin.display()
    );
    let port = free_port();
    let mut cmd = Command::new(&bin);
    cmd.env_clear()
        .env("FERRY_LISTEN", format!("127.0.0.1:{port}"))
        .env("FERRY_REDIS_URL", redis_url)
        .env("FERRY_DATABASE_URL", pg_url)
        // As the superuser, as pgbench runs: one role for everything.
        .envs(ferry_testkit::process::roles_env(pg_url))
        .env("FERRY_SECRET", SECRET)
        // No access lines (`deploy/ferry.toml`'s `log_level` says what they cost).
        .env("FERRY_LOG", "warn")
        // The scenarios send their own SQL, as a trusted caller would.
        .env("FERRY_AUTH_ALLOW_RAW_SQL", "true")
        .env("FERRY_SERVER_MAX_IN_FLIGHT", "4096")
        .env("FERRY_SERVER_ADMIN_LISTEN", "")
        .env("FERRY_CONFIG", config_file())
        .env("FERRY_UPSTASH_ENABLED", "true")
        // The bench compares the door with webdis on one Redis.
        .env("FERRY_UPSTASH_SHARE_CACHE_REDIS", "true")
        .env("FERRY_UPSTASH_TOKEN", UPSTASH_TOKEN)
        .env("FERRY_NEON_ENABLED", "true")
        .env("FERRY_NEON_TOKEN", NEON_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("start the sidecar");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let proc_ = Proc { child, addr };
    wait_until("the sidecar to be ready", Duration::from_secs(20), || {
        std::net::TcpStream::connect(addr).is_ok()
    });
    proc_
}

/// webdis in front of `redis` (foreground, its own config in a temp dir).
pub fn start_webdis(redis: &RedisServer, dir: &std::path::Path) -> Proc {
    let port = free_port();
    let conf = dir.join("webdis.json");
    std::fs::write(
        &conf,
        serde_json::json!({
            "redis_host": "127.0.0.1",
            "redis_port": redis.port,
            "redis_auth": redis.password,
            "http_host": "127.0.0.1",
            "http_port": port,
            "threads": 2,
            "pool_size": 8,
            "daemonize": false,
            "database": 0,
            "verbosity": 0,
            "logfile": dir.join("webdis.log"),
        })
        .to_string(),
    )
    .expect("write webdis.json");
    let child = Command::new("webdis")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start webdis (apt-get install webdis; scripts/bench.sh installs it)");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let p = Proc { child, addr };
    wait_until("webdis to listen", Duration::from_secs(10), || {
        std::net::TcpStream::connect(addr).is_ok()
    });
    p
}

/// Postgres with a password for TCP clients, the demo schema and pgbench's tables.
pub fn start_postgres() -> (PgServer, String) {
    // wal_level = logical: the staleness scenario's sidecar reads the change stream.
    let pg = PgServer::start_logical();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(crate::scenarios::blog::SCHEMA)
        .expect("the blog scenario's schema");
    let url = pg.require_password(PG_PASSWORD);
    let out = Command::new(pgbench())
        .args(["-i", "-s", "1", "-q", "-h"])
        .arg(pg.socket_dir())
        .args(["-p", &pg.port.to_string(), "-U", "postgres", "postgres"])
        .output()
        .expect("run pgbench -i");
    assert!(
        out.status.success(),
        "pgbench -i failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (pg, url)
}

pub fn pgbench() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.into_iter()
        .rev()
        .map(|d| d.join("pgbench"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("pgbench"))
}

/// Peak RSS sampled and CPU used by a process between two readings.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStat {
    pub rss_kb: u64,
    pub cpu_ticks: u64,
}

pub fn proc_stat(pid: u32) -> ProcStat {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" that ends the command name: utime is the 12th, stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    ProcStat {
        rss_kb,
        cpu_ticks: tick(11) + tick(12),
    }
}

/// CPU clock ticks used by a server and all its processes (Postgres: the postmaster and its
/// backends): its own and its reaped children's time, plus its live children's. The children
/// are read before the parent: a child reaped in between is then counted twice (a tick or two)
/// instead of not at all. Read after clients have disconnected, call [`await_reaped`] first.
pub fn tree_cpu_ticks(pid: u32) -> u64 {
    let children: u64 = children(pid).iter().map(|f| at(f, 11) + at(f, 12)).sum();
    let own = stat_fields(&pid.to_string());
    children + at(&own, 11) + at(&own, 12) + at(&own, 13) + at(&own, 14)
}

/// CPU clock ticks used so far by the threads of `pid` whose name starts with `name`
/// (`/proc/<pid>/task/*/comm`): one part of a process apart from the rest (the sidecar's
/// change-stream threads).
pub fn thread_ticks(pid: u32, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    let mut ticks = 0;
    for entry in tasks.into_iter().flatten().flatten() {
        let tid = entry.file_name().to_string_lossy().to_string();
        let comm =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
        if comm.trim_end().starts_with(name) {
            let f = stat_fields(&format!("{pid}/task/{tid}"));
            ticks += at(&f, 11) + at(&f, 12);
        }
    }
    ticks
}

/// `pid` and its children now (Postgres: the postmaster and its backends).
pub fn tree_pids(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if at(&stat_fields(&child.to_string()), 1) == u64::from(pid) {
            out.push(child);
        }
    }
    out
}

/// How many processes `pid` has as children now.
pub fn child_count(pid: u32) -> usize {
    children(pid).len()
}

/// Waits (up to 5 s) until `pid` has no more than `count` children: a backend whose client
/// has gone leaves /proc as its parent reaps it, its time moving into the parent's cutime; read
/// in that moment, the tree misses it (once, every backend of a pgbench run: 0.8 ms of Postgres
/// CPU per 1,000 transactions where 27 were spent).
pub fn await_reaped(pid: u32, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while child_count(pid) > count && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The /proc/PID/stat fields after the command name: ppid is the 2nd (index 1), utime and
/// stime the 12th and 13th, cutime and cstime the 14th and 15th.
fn stat_fields(pid: &str) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

fn at(fields: &[u64], i: usize) -> u64 {
    fields.get(i).copied().unwrap_or(0)
}

/// The stat fields of each child of `pid`.
fn children(pid: u32) -> Vec<Vec<u64>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(name) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let f = stat_fields(name);
        if at(&f, 1) == u64::from(pid) {
            out.push(f);
        }
    }
    out
}

/// Cores, CPU model, kernel: stamped on every result file.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let version = |cmd: &str, arg: &str| {
        Command::new(cmd)
            .arg(arg)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    serde_json::json!({
        "cores": cores,
        "cpu": model,
        "kernel": version("uname", "-r"),
        "redis": version("redis-server", "--version"),
        "postgres": version(&pgbench().with_file_name("postgres").display().to_string(), "--version"),
        "ferry": env!("CARGO_PKG_VERSION"),
    })
}

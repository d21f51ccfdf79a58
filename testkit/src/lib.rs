//! Ferry's test harness (used by the sidecar's and the edge's integration tests): private, throwaway Redis and Postgres processes on free ports, the real
//! sidecar app on port 0, and a signing HTTP client. Never mocks, never the machine's shared
//! services. A missing binary fails the test loudly, saying what to install.

pub mod balancer;
pub mod certs;
pub mod client;
pub mod clients;
pub mod doors;
pub mod pgbouncer;
pub mod postgres;
mod postgres_replica;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod redis_cluster;
pub mod sidecar;
pub mod wrangler;

pub use self::balancer::Balancer;
pub use self::client::Client;
pub use self::pgbouncer::PgBouncer;
pub use self::postgres::PgServer;
pub use self::process::{DemoBinary, SidecarProcess};
pub use self::proxy::CutProxy;
pub use self::redis::RedisServer;
pub use self::redis_cluster::RedisCluster;
pub use self::sidecar::Sidecar;
pub use self::wrangler::WranglerDev;

use std::net::TcpListener;
use std::time::{Duration, Instant};

pub const SECRET: &str = "test-secret-0123456789abcdef";
/// The edge's bearer key for writes and the cache routes (FERRY_API_KEY in workerd).
pub const API_KEY: &str = "test-edge-api-key-0123456789";
/// The key the edge verifies end users' JWTs with (FERRY_JWT_SECRET in workerd).
pub const JWT_SECRET: &str = "test-jwt-key-0123456789abcdef0123456789";

/// A port nothing listens on right now, and that no other test of this process was given.
///
/// Ports come from below the kernel's ephemeral range (32768 and up on Linux), so an outgoing
/// connection's local port can never take one between this check and the server's bind, and a
/// stopped test server keeps its port for its restart. Each port is handed out once per process:
/// two tests starting servers at the same moment never get the same one.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000; // up to 31,999
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    // A random start, so test processes that run side by side rarely probe the same ports.
    let start = (RandomState::new().hash_one(std::process::id()) % SPAN as u64) as u16;
    for i in 0..SPAN {
        let port = LOW + (start + i) % SPAN;
        if given.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN)
}

/// A process' peak resident memory (VmHWM) in KiB, 0 if it cannot be read.
pub fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Polls `f` until it returns true or `timeout` passes; panics with `what` on timeout.
/// Sends `sig` (`"STOP"`, `"CONT"`, `"KILL"`...) to process `pid`; panics if it cannot.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -{sig} {pid} failed");
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Finds a program on PATH or in the given extra directories, or fails with an install hint.
pub fn find_program(name: &str, extra_dirs: &[String], hint: &str) -> std::path::PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in extra_dirs.iter().map(String::as_str).chain(path.split(':')) {
        let candidate = std::path::Path::new(dir).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{name}` was not found on PATH or in {extra_dirs:?}. {hint} \
         (scripts/test.sh installs everything the tests need)"
    );
}

/// Everything a test needs: Redis, Postgres, a sidecar over them, a client for it.
pub struct Stack {
    pub redis: RedisServer,
    pub pg: PgServer,
    pub sidecar: Sidecar,
    pub client: Client,
}

impl Stack {
    pub fn start() -> Stack {
        Stack::start_with(|_| {})
    }

    /// Starts everything, letting the test adjust the sidecar config first.
    pub fn start_with(adjust: impl FnOnce(&mut ferry_sidecar::Config)) -> Stack {
        Stack::start_on(PgServer::start(), adjust)
    }

    /// The same, on a Postgres of the test's choosing (one that counts statements, say).
    pub fn start_on(pg: PgServer, adjust: impl FnOnce(&mut ferry_sidecar::Config)) -> Stack {
        pg.setup_demo_schema();
        let redis = RedisServer::start();
        let mut config = sidecar::test_config(&redis, &pg);
        adjust(&mut config);
        let sidecar = Sidecar::start(config);
        let client = Client::new(&sidecar.base_url(), SECRET);
        Stack {
            redis,
            pg,
            sidecar,
            client,
        }
    }
}

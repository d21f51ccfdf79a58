//! The sidecar binary as its own process (for tests that need its own memory, its own log,
//! or real signals), configured from environment variables alone.

use super::{free_port, wait_until, Client, SECRET};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct SidecarProcess {
    pub child: Child,
    pub port: u16,
    /// The admin listener (GET /metrics).
    pub admin_port: u16,
    pub client: Client,
}

impl SidecarProcess {
    /// Starts `bin` (a test's `env!("CARGO_BIN_EXE_ferry-sidecar")`) on a free port with
    /// FERRY_LISTEN, FERRY_REDIS_URL, FERRY_DATABASE_URL, FERRY_SECRET (the test secret unless
    /// `env` sets another) plus `env`, stderr to `stderr`; waits until /readyz answers 200.
    ///
    /// The roles: a database URL (`pg_url`, or `env`'s FERRY_DATABASE_URL) as the demo
    /// schema's `ferry_app` runs with the demo's roles kept apart (Ferry's books as
    /// `ferry_owner`, scripts/demo.sql); any other (the superuser) runs with
    /// `postgres.single_role`. `env` may say otherwise.
    pub fn start(
        bin: &str,
        redis_url: &str,
        pg_url: &str,
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> SidecarProcess {
        // A port free when picked can be taken before the binary binds it (other tests start
        // servers too): a binary that exits while starting is started again on new ports.
        let mut attempts = 0;
        // The caller's stderr goes to the first start; a start again shows its own.
        let mut stderr = Some(stderr);
        loop {
            attempts += 1;
            let port = free_port();
            let admin_port = free_port();
            let err = stderr.take().unwrap_or_else(Stdio::inherit);
            let mut child = Self::spawn(bin, redis_url, pg_url, env, port, admin_port, err);
            let secret = env
                .iter()
                .find(|(k, _)| *k == "FERRY_SECRET")
                .map_or(SECRET, |(_, v)| *v);
            let client = Client::new(&format!("http://127.0.0.1:{port}"), secret);
            let mut exited = None;
            wait_until(
                "the binary to become ready",
                Duration::from_secs(20),
                || {
                    if let Ok(Some(status)) = child.try_wait() {
                        exited = Some(status);
                        return true;
                    }
                    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                        && client.block_on(client.ready())
                },
            );
            match exited {
                None => {
                    return SidecarProcess {
                        child,
                        port,
                        admin_port,
                        client,
                    }
                }
                Some(status) if attempts < 3 => {
                    eprintln!("the sidecar exited while starting ({status}); again on new ports");
                }
                Some(status) => {
                    panic!("the sidecar exited while starting, {attempts} times: {status}")
                }
            }
        }
    }

    fn spawn(
        bin: &str,
        redis_url: &str,
        pg_url: &str,
        env: &[(&str, &str)],
        port: u16,
        admin_port: u16,
        stderr: Stdio,
    ) -> Child {
        let mut cmd = Command::new(bin);
        cmd.env_clear()
            .env("FERRY_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "FERRY_SERVER_ADMIN_LISTEN",
                format!("127.0.0.1:{admin_port}"),
            )
            .env("FERRY_REDIS_URL", redis_url)
            .env("FERRY_DATABASE_URL", pg_url)
            .env("FERRY_SECRET", SECRET)
            .env("FERRY_SERVER_WORKERS", "2")
            .env("FERRY_LOG", "error")
            // The tests are trusted callers that send their own SQL.
            .env("FERRY_AUTH_ALLOW_RAW_SQL", "true")
            .envs(roles_env(
                env.iter()
                    .find(|(k, _)| *k == "FERRY_DATABASE_URL")
                    .map_or(pg_url, |(_, v)| v),
            ))
            .stdout(Stdio::null())
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().expect("start the sidecar binary")
    }

    /// One sample of this sidecar's own /metrics, by name and labels as exported
    /// (`ferry_replica_up{replica="0"}`); None when it is not there.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.client.block_on(async {
            reqwest::get(format!("http://127.0.0.1:{}/metrics", self.admin_port))
                .await
                .expect("metrics")
                .text()
                .await
                .expect("metrics text")
        });
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The local ports of the process's TCP sockets (its Postgres connections among them, as
    /// `pg_stat_activity.client_port` sees them): which backends belong to this sidecar.
    pub fn local_ports(&self) -> std::collections::HashSet<u16> {
        let fds = format!("/proc/{}/fd", self.pid());
        let inodes: std::collections::HashSet<String> = std::fs::read_dir(fds)
            .map(|d| d.flatten().collect::<Vec<_>>())
            .unwrap_or_default()
            .iter()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .collect();
        let mut ports = std::collections::HashSet::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let text = std::fs::read_to_string(table).unwrap_or_default();
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split_whitespace().collect();
                // local_address is ip:port in hex; the inode is the tenth column.
                let (Some(local), Some(inode)) = (cols.get(1), cols.get(9)) else {
                    continue;
                };
                if inodes.contains(*inode) {
                    if let Some(port) = local.rsplit(':').next() {
                        ports.extend(u16::from_str_radix(port, 16).ok());
                    }
                }
            }
        }
        ports
    }

    /// SIGTERM (a graceful drain); returns once the process has exited.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        self.child.wait().expect("wait for the sidecar")
    }
}

/// The roles for `pg_url` (see [`SidecarProcess::start`]).
pub fn roles_env(pg_url: &str) -> Vec<(&'static str, String)> {
    match pg_url.strip_prefix("postgres://ferry_app@") {
        Some(rest) => vec![
            (
                "FERRY_POSTGRES_OWNER_URL",
                format!("postgres://ferry_owner@{rest}"),
            ),
            ("FERRY_POSTGRES_SINGLE_ROLE", "false".into()),
        ],
        None => vec![
            ("FERRY_POSTGRES_OWNER_URL", String::new()),
            ("FERRY_POSTGRES_SINGLE_ROLE", "true".into()),
        ],
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What most tests of the binary start from: a private Redis, a private Postgres with the
/// demo schema, and the binary on them with `env` (its log discarded). Each server stops when
/// its field is dropped: bind every field (`redis: _redis`), never `..`.
pub struct DemoBinary {
    pub redis: crate::RedisServer,
    pub pg: crate::PgServer,
    pub sidecar: SidecarProcess,
}

impl DemoBinary {
    pub fn start(bin: &str, env: &[(&str, &str)]) -> DemoBinary {
        let redis = crate::RedisServer::start();
        let pg = crate::PgServer::start();
        pg.setup_demo_schema();
        let sidecar = SidecarProcess::start(bin, &redis.url(), &pg.url(), env, Stdio::null());
        DemoBinary { redis, pg, sidecar }
    }
}

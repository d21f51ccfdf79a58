//! A private redis-server on a free port, with no persistence, that tests may kill and restart.

use super::{find_program, free_port, wait_until};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    pub port: u16,
    /// Set when started with `--requirepass`: clients must AUTH (as on hosted plans).
    pub password: Option<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with_args(&[])
    }

    /// Extra redis-server arguments, e.g. `["--maxclients", "30"]`.
    pub fn start_with_args(args: &[&str]) -> RedisServer {
        let password = args
            .iter()
            .position(|a| *a == "--requirepass")
            .and_then(|i| args.get(i + 1))
            .map(|p| p.to_string());
        let mut r = RedisServer {
            port: free_port(),
            password,
            child: None,
            dir: tempfile::tempdir().expect("tempdir for redis"),
            extra_args: args.iter().map(|s| s.to_string()).collect(),
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let bin = find_program(
            "redis-server",
            &[],
            "Install Redis: apt-get install redis-server.",
        );
        let child = Command::new(bin)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let url = self.url();
        wait_until(
            "redis-server to answer PING",
            Duration::from_secs(10),
            || {
                ::redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection())
                    .and_then(|mut c| ::redis::cmd("PING").query::<String>(&mut c))
                    .is_ok()
            },
        );
    }

    pub fn url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}/", self.port),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    pub fn conn(&self) -> ::redis::Connection {
        ::redis::Client::open(self.url().as_str())
            .and_then(|c| c.get_connection())
            .expect("connect to the test redis")
    }

    /// Whether the process runs (not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL: the abrupt failure (no goodbye to clients), then reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP / SIGCONT: Redis stops answering but keeps its data and connections, like a
    /// network partition that heals.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("redis is running").id();
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} {pid} failed");
    }

    /// Clients connected right now, as Redis counts them (including the one asking).
    pub fn connected_clients(&self) -> u64 {
        self.info_count("clients", "connected_clients")
    }

    /// A count from `INFO <section>` (`field:<n>`); panics when Redis does not report it.
    pub fn info_count(&self, section: &str, field: &str) -> u64 {
        let info: String = ::redis::cmd("INFO")
            .arg(section)
            .query(&mut self.conn())
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
    }

    /// Calls of one command so far (`INFO commandstats`; those scripts make included), 0 when
    /// it never ran.
    pub fn command_calls(&self, cmd: &str) -> u64 {
        let info: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .expect("INFO commandstats");
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused process must be resumed to die cleanly on every platform.
        if self.child.is_some() {
            self.resume();
        }
        self.kill();
    }
}

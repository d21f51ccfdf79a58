//! The server's life after its first start: started again, stopped, and its processes found,
//! frozen and thawed (SIGSTOP, SIGCONT), for the fault tests.

use super::{pg_command, run, PgServer};
use std::path::PathBuf;

impl PgServer {
    /// The postmaster's process id while the cluster runs (the first line of postmaster.pid).
    pub fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The postmaster and every process it started (backends, WAL writer...).
    pub fn pids(&self) -> Vec<u32> {
        let Some(root) = self.postmaster_pid() else {
            return Vec::new();
        };
        let mut pids = vec![root];
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Field 4 (after the parenthesised name) is the parent pid.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(root) {
                pids.push(pid);
            }
        }
        pids
    }

    /// Freezes every Postgres process (SIGSTOP): a hung server, or a network that drops
    /// packets. Returns the processes, for `thaw`.
    pub fn freeze(&self) -> Vec<u32> {
        let pids = self.pids();
        signal(&pids, "STOP");
        pids
    }

    /// Lets frozen processes run again (SIGCONT).
    pub fn thaw(&self, pids: &[u32]) {
        signal(pids, "CONT");
    }

    pub(crate) fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the (stopped) cluster on its port and waits until it accepts connections.
    pub fn start_again(&mut self) {
        if let Err(e) = self.try_start() {
            panic!("{e}");
        }
    }

    pub(crate) fn try_start(&mut self) -> Result<(), String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=100 {}",
            self.port,
            self.dir.path().display(),
            self.extra
        );
        let mut c = pg_command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("postgres.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .current_dir(self.dir.path());
        let out = c
            .output()
            .map_err(|e| format!("pg_ctl start: cannot run: {e}"))?;
        if !out.status.success() {
            // pg_ctl only says "Examine the log output": the reason is in the server's log.
            let log =
                std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(format!(
                "pg_ctl start failed on port {}: {}{}\nserver log (last lines):\n{}",
                self.port,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                tail.join("\n")
            ));
        }
        self.running = true;
        Ok(())
    }

    /// Fast shutdown: active connections are cut, as when an operator stops the server.
    pub fn stop(&mut self) {
        self.stop_mode("fast");
    }

    pub(super) fn stop_mode(&mut self, mode: &str) {
        if !self.running {
            return;
        }
        let mut c = pg_command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .args(["-m", mode, "-w", "-t", "60", "stop"])
            .current_dir(self.dir.path());
        run(c, "pg_ctl stop");
        self.running = false;
    }
}

fn signal(pids: &[u32], sig: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status();
    }
}

//! A private PgBouncer (Debian's package) on a free port in front of a test's Postgres: the
//! pooler an operator may put, or a hosted plan's "pooled" URL may hide, between the sidecar and
//! Postgres. Trust auth, every database passed through.

use super::postgres::{give_to_postgres, is_root};
use super::{find_program, free_port, wait_until};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct PgBouncer {
    pub port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// `mode`: `session` or `transaction`. `users`: the login roles clients may name (PgBouncer
    /// wants each in its auth file, even with trust). `ignore_options`: accept and drop the
    /// `options` startup parameter (the sidecar's session settings), as PgBouncer's own error
    /// ("unsupported startup parameter: options") tells operators to do.
    pub fn start(pg_port: u16, mode: &str, users: &[&str], ignore_options: bool) -> PgBouncer {
        let bin = find_program(
            "pgbouncer",
            &["/usr/sbin".to_string()],
            "Install PgBouncer: apt-get install pgbouncer.",
        );
        let dir = tempfile::tempdir().expect("tempdir for pgbouncer");
        let port = free_port();
        let users_file = dir.path().join("users.txt");
        let listed: String = users.iter().map(|u| format!("\"{u}\" \"\"\n")).collect();
        std::fs::write(&users_file, listed).expect("write the auth file");
        let ignore = if ignore_options {
            "extra_float_digits,options"
        } else {
            "extra_float_digits"
        };
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={pg_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {auth}\npool_mode = {mode}\n\
             default_pool_size = 8\nmax_client_conn = 200\nserver_login_retry = 1\n\
             ignore_startup_parameters = {ignore}\n\
             logfile = {log}\npidfile = {pid}\nadmin_users = postgres\n",
            auth = users_file.display(),
            log = dir.path().join("pgbouncer.log").display(),
            pid = dir.path().join("pgbouncer.pid").display(),
        );
        let ini_file = dir.path().join("pgbouncer.ini");
        std::fs::write(&ini_file, ini).expect("write pgbouncer.ini");
        // PgBouncer refuses to run as root.
        let mut cmd = if is_root() {
            give_to_postgres(dir.path());
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = cmd
            .arg(&ini_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pgbouncer");
        wait_until("pgbouncer to listen", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        PgBouncer { port, child, dir }
    }

    /// A URL for `user` through the pooler, to the `postgres` database.
    pub fn url(&self, user: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/postgres", self.port)
    }

    /// PgBouncer's own log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // Under runuser, PgBouncer is runuser's child: it is stopped by its own pid.
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("pgbouncer.pid")) {
            if let Ok(pid) = pid.trim().parse::<u32>() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

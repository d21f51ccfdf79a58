//! A private Postgres cluster (initdb + pg_ctl) in a temp dir on a free port. Postgres refuses
//! to run as root, so when the tests run as root it runs as the `postgres` user.

use super::{find_program, free_port};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub struct PgServer {
    pub port: u16,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) running: bool,
    /// Extra server options (`-c name=value`), kept across restarts.
    pub(crate) extra: String,
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Debian keeps server binaries out of PATH, in /usr/lib/postgresql/<version>/bin.
fn bin(name: &str) -> PathBuf {
    let mut dirs: Vec<String> = std::env::var("FERRY_PG_BIN").into_iter().collect();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev().map(|p| p.display().to_string()));
    }
    find_program(
        name,
        &dirs,
        "Install PostgreSQL: apt-get install postgresql (or set FERRY_PG_BIN to its bin dir).",
    )
}

/// Runs a Postgres program as the user that may run Postgres.
pub(crate) fn pg_command(name: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin(name));
        c
    } else {
        Command::new(bin(name))
    }
}

pub(crate) fn run(mut c: Command, what: &str) {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn give_to_postgres(path: &Path) {
    if is_root() {
        let mut c = Command::new("chown");
        c.args(["-R", "postgres:postgres"]).arg(path);
        run(c, "chown to postgres");
    }
}

/// initdb takes seconds; it runs once per machine and each test copies the result.
fn template() -> &'static PathBuf {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let version = Command::new(bin("initdb"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().replace(' ', "_"))
            .unwrap_or_default();
        let target = std::env::temp_dir().join(format!("ferry-test-pgdata-{version}"));
        if target.join("PG_VERSION").exists() {
            return target;
        }
        let staging = std::env::temp_dir().join(format!(
            "ferry-test-pgdata-staging-{}-{}",
            std::process::id(),
            super::free_port()
        ));
        std::fs::create_dir_all(&staging).expect("create staging dir");
        give_to_postgres(&staging);
        let mut c = pg_command("initdb");
        c.arg("-D")
            .arg(&staging)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .current_dir(std::env::temp_dir());
        run(c, "initdb");
        // Another test process may have won the race; either copy is as good.
        if std::fs::rename(&staging, &target).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        target
    })
}

impl PgServer {
    pub fn start() -> PgServer {
        PgServer::start_with("")
    }

    /// A server that can stream its changes (`wal_level = logical`), for change-stream tests.
    /// Commits are flushed as on a production server (`synchronous_commit = on`): a WAL sender
    /// only streams flushed WAL, and with it off the WAL writer would add up to 200 ms.
    pub fn start_logical() -> PgServer {
        PgServer::start_with(
            "-c wal_level=logical -c max_replication_slots=8 -c max_wal_senders=8 \
             -c synchronous_commit=on",
        )
    }

    /// A server that counts every statement it runs (`pg_stat_statements`, loaded at start and
    /// created in the database): what a request cost Postgres, judged by Postgres
    /// ([`PgServer::statements`]).
    pub fn start_counting() -> PgServer {
        let pg = PgServer::start_with("-c shared_preload_libraries=pg_stat_statements");
        pg.client()
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .expect("pg_stat_statements");
        pg
    }

    /// How many times statements whose text contains `fragment` have run (see
    /// [`PgServer::start_counting`]): not counting the sidecar's analysis of a statement (the
    /// temporary function `ferry_plain_probe` whose body it is, `store/postgres/analysis.rs`).
    pub fn statements(&self, fragment: &str) -> i64 {
        self.client()
            .query_one(
                "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements \
                 WHERE query LIKE '%' || $1 || '%' AND query NOT LIKE '%pg_stat_statements%' \
                   AND query NOT LIKE '%ferry_plain_probe%'",
                &[&fragment],
            )
            .expect("pg_stat_statements")
            .get(0)
    }

    /// A server with more options (`-c name=value ...`), kept across restarts.
    pub fn start_with(extra: &str) -> PgServer {
        let dir = tempfile::tempdir().expect("tempdir for postgres");
        let mut c = Command::new("cp");
        c.arg("-a").arg(template()).arg(dir.path().join("data"));
        run(c, "copy the template cluster");
        give_to_postgres(dir.path());
        let mut pg = PgServer {
            port: free_port(),
            dir,
            running: false,
            extra: extra.to_string(),
        };
        pg.start_on_a_free_port();
        pg
    }

    /// Starts a new cluster: another program on this machine may take the port between the
    /// check and the bind, so another port is tried then.
    pub(crate) fn start_on_a_free_port(&mut self) {
        for _ in 0..3 {
            match self.try_start() {
                Ok(()) => return,
                Err(e) if e.contains("could not bind") => self.port = free_port(),
                Err(e) => panic!("{e}"),
            }
        }
        self.start_again();
    }

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

    fn stop_mode(&mut self, mode: &str) {
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

    pub fn url(&self) -> String {
        self.url_as("postgres")
    }

    /// The URL for another login role (trust auth: no password), e.g. the demo schema's
    /// least-privilege `ferry_app`.
    pub fn url_as(&self, role: &str) -> String {
        format!("postgres://{role}@127.0.0.1:{}/postgres", self.port)
    }

    /// A superuser client over the unix socket (trust auth, even after `require_password`).
    pub fn client(&self) -> ::postgres::Client {
        let mut cfg = ::postgres::Config::new();
        cfg.host_path(self.dir.path())
            .port(self.port)
            .user("postgres")
            .dbname("postgres");
        cfg.connect(::postgres::NoTls)
            .expect("connect to the test postgres")
    }

    /// Makes TCP clients authenticate with a password (SCRAM), as hosted Postgres does, so
    /// a fresh connection pays the auth round trips. Returns the URL with the password.
    pub fn require_password(&self, password: &str) -> String {
        let mut c = self.client();
        c.batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256'; ALTER USER postgres PASSWORD '{password}';"
        ))
        .expect("set password");
        std::fs::write(
            self.data().join("pg_hba.conf"),
            "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
        )
        .expect("write pg_hba.conf");
        c.batch_execute("SELECT pg_reload_conf()").expect("reload");
        // Give the postmaster a moment to reread pg_hba.conf.
        std::thread::sleep(std::time::Duration::from_millis(300));
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// Turns TLS on with this certificate and key (copied into the data directory, where
    /// Postgres insists on owning the key with mode 0600).
    pub fn enable_ssl(&self, cert: &str, key: &str) {
        let data = self.data();
        std::fs::copy(cert, data.join("server.pem")).expect("copy cert");
        std::fs::copy(key, data.join("server.key")).expect("copy key");
        let mut c = Command::new("chmod");
        c.arg("600").arg(data.join("server.key"));
        run(c, "chmod the key");
        give_to_postgres(&data);
        let mut client = self.client();
        // One statement at a time: ALTER SYSTEM refuses to run in a transaction block.
        for stmt in [
            "ALTER SYSTEM SET ssl = on",
            "ALTER SYSTEM SET ssl_cert_file = 'server.pem'",
            "ALTER SYSTEM SET ssl_key_file = 'server.key'",
            "SELECT pg_reload_conf()",
        ] {
            client.batch_execute(stmt).expect("enable ssl");
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }

    /// The directory Postgres' unix socket is in (trust auth there).
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The demo schema (scripts/demo.sql) plus a read counter for "did this touch Postgres".
    pub fn setup_demo_schema(&self) {
        let demo = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo.sql"),
        )
        .expect("read scripts/demo.sql");
        let mut c = self.client();
        c.batch_execute(&demo).expect("load demo schema");
        // Reads run in read-only transactions, so the counter is bumped on a connection of its
        // own (dblink over the trusted unix socket), committed whatever the read's fate.
        let conninfo = format!(
            "host={} port={} user=postgres dbname=postgres",
            self.socket_dir().display(),
            self.port
        );
        c.batch_execute(&format!(
            "CREATE EXTENSION IF NOT EXISTS dblink;
             CREATE TABLE ferry_test_reads (n bigint NOT NULL);
             INSERT INTO ferry_test_reads VALUES (0);
             CREATE FUNCTION ferry_test_touch() RETURNS bigint LANGUAGE sql VOLATILE
               SECURITY DEFINER AS
               $$ SELECT n FROM dblink('{conninfo}',
                    'UPDATE ferry_test_reads SET n = n + 1 RETURNING n') AS t(n bigint) $$;
             GRANT EXECUTE ON FUNCTION ferry_test_touch() TO PUBLIC;"
        ))
        .expect("create the read counter");
    }

    /// How many times statements calling `ferry_test_touch()` ran on Postgres.
    pub fn reads(&self) -> i64 {
        self.client()
            .query_one("SELECT n FROM ferry_test_reads", &[])
            .expect("read counter")
            .get(0)
    }

    /// Backends the sidecar holds (it connects with application_name = ferry-sidecar).
    pub fn sidecar_backends(&self) -> i64 {
        self.client()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'",
                &[],
            )
            .expect("count backends")
            .get(0)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop_mode("immediate");
    }
}

fn signal(pids: &[u32], sig: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status();
    }
}

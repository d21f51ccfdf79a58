//! A private Postgres cluster (initdb + pg_ctl) in a temp dir on a free port. Postgres refuses
//! to run as root, so when the tests run as root it runs as the `postgres` user. `process.rs`:
//! starting it again, stopping it, and its processes (frozen and thawed, for fault tests).

use super::{find_program, free_port};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod process;

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

    pub fn url(&self) -> String {
        self.url_as("postgres")
    }

    /// The URL for another login role (trust auth: no password), e.g. the demo schema's
    /// least-privilege `ferry_app`.
    pub fn url_as(&self, role: &str) -> String {
        format!("postgres://{role}@127.0.0.1:{}/postgres", self.port)
    }

    /// What the server has written to its log so far (errors included: a statement Postgres
    /// refused is logged with its text).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).expect("postgres.log")
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

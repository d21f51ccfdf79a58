//! A pooler between the sidecar and Postgres (PgBouncer, Debian's package): what an operator
//! adds to cap connections, or what a hosted plan's "pooled" URL leads to. Ferry is a pooler
//! itself and relies on owning each Postgres session for a request's length: an end user's role
//! and claims, the reset after a request, the session settings it asks for at connect. Behind a
//! transaction-mode pooler, one request's statements land on other clients' sessions.
//!
//! The adversary: an operator who did what every error message said (PgBouncer's "unsupported
//! startup parameter: options" → `ignore_startup_parameters`; the settings then given to the
//! role with `ALTER ROLE ... SET`), with end users reading through row-level security. Postgres's
//! own `current_user` and settings, as each statement sees them, judge.
use ferry_testkit::{PgBouncer, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

const CONFIG: &str = r#"
[identity]
roles = ["authenticated"]
claims_setting = "request.jwt.claims"
rate_per_s = 0

# Who the statement runs as, as Postgres sees it.
[queries.whoami]
sql = """SELECT current_user::text AS role,
                coalesce(current_setting('request.jwt.claims', true), '')::text AS claims"""

[queries.held]
sql = "SELECT count(*)::int AS n FROM pg_prepared_statements"
skip_reset = true
"#;

/// The settings the sidecar asks for at connect, given to its role instead (as an operator
/// behind a pooler that drops them would).
const ROLE_SETTINGS: &str = "ALTER ROLE ferry_app SET default_transaction_read_only = on;
     ALTER ROLE ferry_app SET idle_in_transaction_session_timeout = '30s';
     ALTER ROLE ferry_app SET statement_timeout = '30s';";

struct Lab {
    _redis: RedisServer,
    pg: PgServer,
    bouncer: PgBouncer,
    _dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

fn lab(mode: &str, role_settings: bool) -> Lab {
    lab_with(mode, role_settings, true)
}

/// `ignore_options`: PgBouncer drops the settings Ferry sends at connect (else it refuses them).
fn lab_with(mode: &str, role_settings: bool, ignore_options: bool) -> Lab {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema(); // ferry_app (plain role) and `authenticated`
    pg.client()
        .batch_execute(
            "CREATE TABLE pooler_rows (id int); INSERT INTO pooler_rows VALUES (1), (2);
             GRANT SELECT, DELETE ON pooler_rows TO ferry_app;",
        )
        .expect("table");
    if role_settings {
        let settings = pg.client().batch_execute(ROLE_SETTINGS);
        settings.expect("role settings");
    }
    let bouncer = PgBouncer::start(pg.port, mode, &["ferry_app", "postgres"], ignore_options);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ferry.toml");
    std::fs::write(&file, CONFIG).expect("write config");
    let env = vec![
        ("FERRY_CONFIG".into(), file.to_str().expect("utf-8").into()),
        ("FERRY_REDIS_URL".into(), redis.url()),
        ("FERRY_DATABASE_URL".into(), bouncer.url("ferry_app")),
        ("FERRY_POSTGRES_POOL_SIZE".into(), "4".into()),
        // Ferry's books go straight to Postgres, as its own role (not through the pooler).
        ("FERRY_POSTGRES_OWNER_URL".into(), pg.url_as("ferry_owner")),
        ("FERRY_POSTGRES_SINGLE_ROLE".into(), "false".into()),
    ];
    Lab {
        _redis: redis,
        pg,
        bouncer,
        _dir: dir,
        env,
    }
}

impl Lab {
    fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    fn start(&self) -> SidecarProcess {
        let url = self.bouncer.url("ferry_app");
        SidecarProcess::start(BIN, "", &url, &self.env(), Stdio::inherit())
    }

    /// The binary on `port`, configured by the lab, its stderr piped.
    fn spawn(&self, port: u16) -> Running {
        let admin = format!("127.0.0.1:{}", ferry_testkit::free_port());
        let child = Command::new(BIN)
            .env_clear()
            .env("FERRY_LISTEN", format!("127.0.0.1:{port}"))
            .env("FERRY_SERVER_ADMIN_LISTEN", admin)
            .env("FERRY_SECRET", ferry_testkit::SECRET)
            .env("FERRY_LOG", "error")
            .envs(self.env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the sidecar");
        Running(child)
    }

    /// Runs the binary until it exits (or 20 s): its exit code and what it wrote to stderr.
    fn refused(&self) -> (Option<i32>, String) {
        let mut child = self.spawn(ferry_testkit::free_port());
        let start = Instant::now();
        let code = loop {
            if let Some(status) = child.0.try_wait().expect("wait") {
                break status.code();
            }
            if start.elapsed() > Duration::from_secs(20) {
                // Ended here, or reading its stderr below would wait for it for good.
                let _ = child.0.kill();
                let _ = child.0.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        if let Some(mut s) = child.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut s, &mut err);
        }
        (code, err)
    }
}

fn as_user(sub: &str) -> Value {
    json!({"role": "authenticated", "claims": {"sub": sub}})
}

/// Concurrent reads as three end users and as the sidecar itself: how many answers ran as
/// someone else (another role, or another user's claims).
fn wrong_answers(sidecar: &SidecarProcess, rounds: usize) -> (usize, usize, usize) {
    let wrong = std::sync::atomic::AtomicUsize::new(0);
    let total = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for who in [Some("alice"), Some("bob"), None, Some("carol")] {
            let (wrong, total, failed) = (&wrong, &total, &failed);
            s.spawn(move || {
                for _ in 0..rounds {
                    let mut body = json!({"query": "whoami"});
                    if let Some(sub) = who {
                        body["identity"] = as_user(sub);
                    }
                    let a = sidecar.client.query(body);
                    total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if a.status != 200 {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    let row = &a.body["rows"][0];
                    let ok = match who {
                        Some(sub) => {
                            row["role"] == "authenticated"
                                && row["claims"]
                                    .as_str()
                                    .is_some_and(|c| c.contains(&format!("\"{sub}\"")))
                        }
                        None => row["role"] == "ferry_app" && row["claims"] == "",
                    };
                    if !ok {
                        wrong.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    (wrong.into_inner(), failed.into_inner(), total.into_inner())
}

/// Ferry refused to start, saying why (`what` is in its message).
fn assert_refused(lab: &Lab, what: &str) {
    let (code, err) = lab.refused();
    assert!(
        code.is_some_and(|c| c != 0),
        "the sidecar did not stop (exit {code:?}): {err}"
    );
    assert!(
        err.contains("does not give Ferry sessions of its own") && err.contains(what),
        "{err}"
    );
}

#[test]
fn a_transaction_mode_pooler_is_refused_before_any_request_runs() {
    // Without the refusal, about half of these reads ran as another caller (274, 297 and 290
    // of 600 in three runs, PgBouncer 1.18): see `wrong_answers`.
    let lab = lab("transaction", true);
    assert_refused(&lab, "transaction-mode pooler");
}

#[test]
fn every_probe_through_a_transaction_mode_pooler_refuses_it() {
    // The probe is asked again while it could not give a verdict (Postgres down), and every
    // probe is a chance for the pooler's interleaving of its statements to pass it. So a probe
    // through the pooler must refuse it, not give up: before 2026-12-04, 149 of 150 gave up
    // ("prepared statement \"s5\" already exists", taken for an unreachable Postgres).
    let lab = lab("transaction", true);
    for run in 0..30 {
        let out = Command::new(BIN)
            .env_clear()
            .env("FERRY_SECRET", ferry_testkit::SECRET)
            .envs(lab.env.iter().cloned())
            .arg("--check-config")
            .output()
            .expect("run the sidecar");
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "probe {run}: {said}");
        assert!(
            said.contains("transaction-mode pooler"),
            "probe {run}: {said}"
        );
    }
}

#[test]
fn a_pooler_that_drops_the_session_settings_is_refused() {
    // Session mode, but the settings Ferry asks for at connect never arrive: reads would no
    // longer be read-only by default.
    let lab = lab("session", false);
    assert_refused(&lab, "default_transaction_read_only = on");
}

#[test]
fn a_pooler_that_refuses_the_session_settings_is_named() {
    // PgBouncer as installed: it refuses the `options` startup parameter. The sidecar says so
    // at startup, rather than starting and failing every connect.
    let lab = lab_with("transaction", true, false);
    assert_refused(&lab, "unsupported startup parameter");
}

#[test]
fn a_session_mode_pooler_with_the_settings_on_the_role_serves_every_read_as_its_own() {
    let lab = lab("session", true);
    let sidecar = lab.start();
    let (wrong, failed, total) = wrong_answers(&sidecar, 100);
    assert_eq!(
        (wrong, failed),
        (0, 0),
        "{wrong} of {total} reads ran as someone else, {failed} failed"
    );
    // Statements kept prepared between requests find themselves there.
    for _ in 0..20 {
        let a = sidecar.client.query(json!({"query": "held"}));
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    // Reads are still read-only (the role's setting): a write hidden in a read fails, and the
    // rows stay.
    let count = || -> i64 {
        let row = lab
            .pg
            .client()
            .query_one("SELECT count(*) FROM pooler_rows", &[]);
        row.expect("count").get(0)
    };
    let before = count();
    let a = sidecar.client.query(
        json!({"sql": "WITH gone AS (DELETE FROM pooler_rows RETURNING 1) SELECT count(*) FROM gone"}),
    );
    assert_eq!(a.status, 400, "{:?}", a.body);
    assert_eq!(a.body["error"]["pg_code"], "25006", "{:?}", a.body);
    assert_eq!(count(), before);
}

#[test]
fn a_pooler_found_once_postgres_comes_up_is_refused_without_serving() {
    // Postgres is down when the sidecar starts: it starts, and serves nothing from Postgres
    // until the readiness probe has looked at the sessions.
    let mut lab = lab("transaction", true);
    lab.pg.stop();
    lab.env
        .push(("FERRY_SERVER_READINESS_INTERVAL_MS".into(), "100".into()));
    let port = ferry_testkit::free_port();
    let mut child = lab.spawn(port);
    let client =
        ferry_testkit::Client::new(&format!("http://127.0.0.1:{port}"), ferry_testkit::SECRET);
    ferry_testkit::wait_until("the sidecar to listen", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut stderr = child.0.stderr.take().expect("stderr");
    let collected = log.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = std::io::Read::read(&mut stderr, &mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            collected.lock().expect("log").push_str(&text);
        }
    });
    lab.pg.start_again();
    // Every read is refused, before and after the probe finds the pooler (and says so).
    let found = || log.lock().expect("log").contains("transaction-mode pooler");
    let until = Instant::now() + Duration::from_secs(30);
    let mut after = 0;
    while after < 20 {
        assert!(
            Instant::now() < until,
            "never said: {}",
            log.lock().expect("log")
        );
        after += usize::from(found());
        let a = client.query(json!({"query": "whoami", "identity": as_user("alice")}));
        assert_eq!(a.status, 503, "{:?} {}", a.body, log.lock().expect("log"));
        assert_eq!(a.code(), "database_unavailable");
        assert_eq!(client.get("/readyz").status, 503);
    }
}

/// The sidecar, killed when the test ends, passed or failed.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A streaming replica reached through PgBouncer in `mode`: (whether reads ever had it in use,
/// index scans of the test table the replica ran while the reads went on).
fn replica_through(mode: &str) -> (bool, i64) {
    let redis = RedisServer::start();
    let primary = PgServer::start_with("-c synchronous_commit=on");
    primary
        .client()
        .batch_execute(&format!(
            "CREATE TABLE rep_rows (id int PRIMARY KEY); INSERT INTO rep_rows VALUES (1);
             {}",
            ROLE_SETTINGS.replace("ferry_app", "postgres")
        ))
        .expect("table and role settings");
    let replica = PgServer::replica_of(&primary, "");
    let bouncer = PgBouncer::start(replica.port, mode, &["postgres"], true);
    let url = bouncer.url("postgres");
    let env = [
        ("FERRY_REPLICAS_URLS", url.as_str()),
        ("FERRY_REPLICAS_POLL_MS", "20"),
        ("FERRY_REPLICAS_READS", "any"),
    ];
    let sidecar = SidecarProcess::start(BIN, &redis.url(), &primary.url(), &env, Stdio::null());
    let metric = |name: &str| sidecar.metric(&format!("{name}{{replica=\"0\"}}"));
    ferry_testkit::wait_until("the replica checked", Duration::from_secs(10), || {
        metric("ferry_replica_up") == Some(1.0)
    });
    let scans = || -> i64 {
        let sql =
            "SELECT COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'rep_rows'";
        replica.client().query_one(sql, &[]).expect("scans").get(0)
    };
    let before = scans();
    let mut in_use = false;
    for _ in 0..100 {
        in_use |= metric("ferry_replica_in_use") == Some(1.0);
        let a = sidecar
            .client
            .query(json!({"sql": "SELECT id FROM rep_rows WHERE id = $1", "params": [1]}));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body["rows"][0]["id"], 1);
    }
    // Statistics reach the view after the backend reports them (at most every 500 ms on 15).
    std::thread::sleep(Duration::from_millis(1200));
    (in_use, scans() - before)
}

#[test]
fn a_replica_behind_a_transaction_mode_pooler_is_never_used() {
    let (in_use, scans) = replica_through("transaction");
    assert!(
        !in_use && scans == 0,
        "in use: {in_use}, {scans} reads on it"
    );
    // The same replica behind a session-mode pooler serves reads (the check is not what
    // keeps a replica out).
    let (in_use, scans) = replica_through("session");
    assert!(in_use && scans > 0, "in use: {in_use}, {scans} reads on it");
}

/// No pooler: Postgres is down when the sidecar starts (the sessions cannot be checked yet),
/// then comes up. Reads are served again soon after, whatever `server.readiness_interval_ms`
/// says (the probe that checks the sessions must not wait for it).
#[test]
fn postgres_down_at_startup_is_served_soon_after_it_comes_up() {
    let mut lab = lab("session", true);
    lab.env.retain(|(k, _)| k != "FERRY_DATABASE_URL");
    lab.env.push((
        "FERRY_DATABASE_URL".into(),
        lab.pg.url().replace("postgres@", "ferry_app@"),
    ));
    lab.env.push((
        "FERRY_SERVER_READINESS_INTERVAL_MS".into(),
        "3600000".into(),
    ));
    lab.pg.stop();
    let port = ferry_testkit::free_port();
    let _child = lab.spawn(port);
    let client =
        ferry_testkit::Client::new(&format!("http://127.0.0.1:{port}"), ferry_testkit::SECRET);
    ferry_testkit::wait_until("the sidecar to listen", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let a = client.query(json!({"query": "whoami"}));
    assert_eq!(a.code(), "database_unavailable", "{:?}", a.body);
    lab.pg.start_again();
    let back = Instant::now();
    ferry_testkit::wait_until("reads served again", Duration::from_secs(5), || {
        client.query(json!({"query": "whoami"})).status == 200
    });
    println!("FIGURES served {:?} after Postgres came up", back.elapsed());
}

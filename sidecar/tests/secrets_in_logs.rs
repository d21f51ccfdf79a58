//! Nothing internal leaks: with debug logging on and every kind of failure provoked, neither
//! responses nor the sidecar's log lines contain the HMAC secret, the database password or
//! the connection strings.
use ferry_testkit::{self as common, PgServer, RedisServer};
use serde_json::json;
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn no_secret_in_responses_or_logs() {
    let redis = RedisServer::start_with_args(&["--requirepass", "redis-pass-5ecret"]);
    let mut pg = PgServer::start();
    pg.setup_demo_schema();
    let pg_url = pg.require_password("pg-pass-5ecret");
    let secret = "hmac-secret-5ecret-0123456789";
    let log = tempfile::NamedTempFile::new().expect("log file");
    let mut sidecar = common::SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg_url,
        &[("FERRY_SECRET", secret), ("FERRY_LOG", "debug")],
        Stdio::from(log.reopen().expect("reopen")),
    );
    let c = sidecar.client.clone();
    let mut bodies = Vec::new();
    bodies.push(
        c.query(json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 5}}))
            .body,
    );
    bodies.push(c.query(json!({"sql": "SELEC broken"})).body);
    bodies.push(
        c.query(json!({"sql": "SELECT $1::int", "params": ["x"]}))
            .body,
    );
    bodies.push(
        common::Client::new(&c.base, "wrong-secret-0123456789")
            .query(json!({"sql": "SELECT 1"}))
            .body,
    );
    pg.stop();
    bodies.push(c.query(json!({"sql": "SELECT 1"})).body);
    bodies.push(
        c.execute(json!({"sql": "UPDATE items SET name = 'x'"}))
            .body,
    );
    bodies.push(c.get("/readyz").body);
    sidecar.terminate();
    let logs = std::fs::read_to_string(log.path()).expect("read log");
    let needles = ["5ecret", &pg_url, "pg-pass", "redis-pass", secret];
    for n in needles {
        for b in &bodies {
            assert!(!b.to_string().contains(n), "response leaks {n}: {b}");
        }
        assert!(!logs.contains(n), "the log leaks {n}");
    }
    println!(
        "FIGURES secrets: {} responses and {} log lines checked, none contains a secret, password or URL",
        bodies.len(),
        logs.lines().count()
    );
    assert!(logs.lines().count() > 5, "debug logging was on");
}

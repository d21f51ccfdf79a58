//! The real binary: runs from environment variables alone, validates config naming the bad
//! key, and shuts down gracefully on SIGTERM (in-flight requests finish).
use ferry_testkit as common;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn check_config_names_the_bad_key() {
    let out = Command::new(BIN)
        .arg("--check-config")
        .env_clear()
        .env("FERRY_SECRET", common::SECRET)
        .env("FERRY_REDIS_POOL_SIZE", "lots")
        .output()
        .expect("run binary");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("redis.pool_size") && err.contains("FERRY_REDIS_POOL_SIZE"),
        "{err}"
    );

    let out = Command::new(BIN)
        .arg("--check-config")
        .env_clear()
        .output()
        .expect("run binary");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("auth.secret"));

    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let out = Command::new(BIN)
        .args(["--check-config", "--config", sample])
        .env_clear()
        .env("FERRY_SECRET", common::SECRET)
        .output()
        .expect("run binary");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "config ok");
}

#[test]
fn runs_from_env_alone_and_drains_on_sigterm() {
    let redis = common::RedisServer::start();
    let pg = common::PgServer::start();
    pg.setup_demo_schema();
    let port = common::free_port();
    let mut child = Command::new(BIN)
        .env_clear()
        .env("FERRY_LISTEN", format!("127.0.0.1:{port}"))
        .env("FERRY_REDIS_URL", redis.url())
        .env("FERRY_DATABASE_URL", pg.url())
        .env("FERRY_SECRET", common::SECRET)
        .env("FERRY_SERVER_WORKERS", "2")
        .env("FERRY_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start binary");
    let client = common::Client::new(&format!("http://127.0.0.1:{port}"), common::SECRET);
    common::wait_until(
        "the binary to become ready",
        Duration::from_secs(20),
        || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && client.get("/readyz").status == 200
        },
    );
    let r =
        client.query(json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 5}}));
    assert_eq!(r.status, 200, "{:?}", r.body);

    // A slow request in flight when SIGTERM arrives still completes.
    let c = client.clone();
    let slow = std::thread::spawn(move || {
        c.query(json!({"sql": "SELECT pg_sleep(1)::text AS s, 1 AS done"}))
    });
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let answer = slow.join().expect("slow request");
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.body["rows"][0]["done"], 1);

    let status = child.wait().expect("wait");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "no longer listening"
    );
}

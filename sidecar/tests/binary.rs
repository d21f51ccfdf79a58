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
    // Then a warning: no Postgres is running here, so the role could not be checked.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().next(), Some("config ok"), "{stdout}");
    assert!(
        stdout.contains("warning: the database role was not checked"),
        "{stdout}"
    );
}

#[test]
fn check_config_refuses_an_upstash_door_on_the_caches_redis() {
    let check = |door: Option<&str>| {
        let mut toml = String::from(
            "[postgres]\nsingle_role = true\n[redis]\nurl = \"redis://127.0.0.1:6390\"\n[upstash]\nenabled = true\n\
             [[upstash.tokens]]\ntoken = \"check-config-upstash-0123456789abcdef\"\n\
             prefix = \"app:\"\n",
        );
        if let Some(url) = door {
            toml = toml.replace(
                "enabled = true",
                &format!("enabled = true\nredis_url = \"{url}\""),
            );
        }
        let file = ferry_testkit::doors::config_file(&toml);
        let out = Command::new(BIN)
            .arg("--check-config")
            .arg("--config")
            .arg(file.path())
            .env_clear()
            .env("FERRY_SECRET", common::SECRET)
            .output()
            .expect("run binary");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // No Redis of its own, and no opt-in to sharing the cache's.
    let (code, err) = check(None);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("upstash.redis_url") && err.contains("share_cache_redis"),
        "{err}"
    );
    // The cache's Redis under another name and database is still the cache's Redis.
    let (code, err) = check(Some("redis://localhost:6390/3"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is the cache's Redis server"), "{err}");
    // Another server is the door's own.
    let (code, err) = check(Some("redis://127.0.0.1:6391"));
    assert_ne!(code, Some(2), "{err}");
}

#[test]
fn runs_from_env_alone_and_drains_on_sigterm() {
    let redis = common::RedisServer::start();
    let pg = common::PgServer::start();
    pg.setup_demo_schema();
    let mut sidecar = common::SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[("FERRY_LOG", "warn")],
        Stdio::piped(),
    );
    let port = sidecar.port;
    let client = sidecar.client.clone();
    let r =
        client.query(json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 5}}));
    assert_eq!(r.status, 200, "{:?}", r.body);

    // A slow request in flight when SIGTERM arrives still completes.
    let c = client.clone();
    let slow = std::thread::spawn(move || {
        c.query(json!({"sql": "SELECT pg_sleep(1)::text AS s, 1 AS done"}))
    });
    std::thread::sleep(Duration::from_millis(300));
    // Returns once the process exited: after draining the slow request.
    let status = sidecar.terminate();
    let answer = slow.join().expect("slow request");
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.body["rows"][0]["done"], 1);

    assert!(status.success(), "exit status {status:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "no longer listening"
    );
}

#[test]
fn check_config_warns_about_a_superuser_role() {
    let pg = common::PgServer::start();
    pg.setup_demo_schema();
    let check = |url: &str| {
        let out = Command::new(BIN)
            .arg("--check-config")
            .env_clear()
            .env("FERRY_SECRET", common::SECRET)
            .env("FERRY_DATABASE_URL", url)
            .envs(ferry_testkit::process::roles_env(url))
            .output()
            .expect("run binary");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let as_superuser = check(&pg.url());
    assert!(
        as_superuser.contains("warning:") && as_superuser.contains("superuser"),
        "{as_superuser}"
    );
    // The demo schema's least-privilege role: no warning.
    let app = check(&format!(
        "postgres://ferry_app@127.0.0.1:{}/postgres",
        pg.port
    ));
    assert_eq!(app.trim(), "config ok", "{app}");
    // Identity roles: the demo's `authenticated` is granted to ferry_app; a missing one, and
    // one that bypasses RLS, are named.
    pg.client()
        .batch_execute("CREATE ROLE strong NOLOGIN BYPASSRLS; GRANT strong TO ferry_app")
        .expect("create role");
    let out = Command::new(BIN)
        .arg("--check-config")
        .env_clear()
        .env("FERRY_SECRET", common::SECRET)
        .env(
            "FERRY_DATABASE_URL",
            format!("postgres://ferry_app@127.0.0.1:{}/postgres", pg.port),
        )
        .env("FERRY_POSTGRES_OWNER_URL", pg.url_as("ferry_owner"))
        .env("FERRY_IDENTITY_ROLES", "authenticated,ghost,strong")
        .output()
        .expect("run binary");
    let roles = String::from_utf8_lossy(&out.stdout);
    assert!(roles.contains("\"ghost\" does not exist"), "{roles}");
    assert!(
        roles.contains("\"strong\" is a superuser or has BYPASSRLS"),
        "{roles}"
    );
    assert!(!roles.contains("\"authenticated\""), "{roles}");
    pg.client()
        .batch_execute("ALTER ROLE ferry_app BYPASSRLS")
        .expect("alter role");
    let bypass = check(&format!(
        "postgres://ferry_app@127.0.0.1:{}/postgres",
        pg.port
    ));
    assert!(bypass.contains("BYPASSRLS"), "{bypass}");
}

#[test]
fn a_taken_port_is_named_at_startup() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = Command::new(BIN)
        .env_clear()
        .env("FERRY_SECRET", common::SECRET)
        .env("FERRY_LISTEN", format!("127.0.0.1:{}", common::free_port()))
        .env("FERRY_SERVER_ADMIN_LISTEN", &addr)
        .env("FERRY_LOG", "error")
        .env("FERRY_POSTGRES_SINGLE_ROLE", "true")
        .output()
        .expect("run binary");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server.admin_listen") && err.contains(&addr),
        "the failing listener and its address are named: {err}"
    );
}

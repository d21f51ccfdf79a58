//! SIGHUP reloads what can change safely (named queries, keyspaces, cache limits,
//! allow_raw_sql, log level) without dropping a request; what needs a restart is reported and
//! left as it was; a config that does not load is refused whole.
use ferry_testkit::{self as common, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn hup(pid: u32) {
    assert!(Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill")
        .success());
}

#[test]
fn sighup_applies_named_queries_and_refuses_bad_configs() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ferry.toml");
    std::fs::write(&file, "[cache]\nmax_batch = 10\n").expect("write");
    let log = tempfile::NamedTempFile::new().expect("log");
    let mut sidecar = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_CONFIG", file.to_str().expect("utf-8")),
            ("FERRY_LOG", "info"),
        ],
        Stdio::from(log.reopen().expect("log")),
    );
    let c = sidecar.client.clone();
    let named = json!({"query": "added_later", "params": [3]});
    assert_eq!(c.query(named.clone()).status, 400, "not configured yet");

    // Add a named query, and change the Redis pool size (which needs a restart).
    std::fs::write(
        &file,
        "[redis]\npool_size = 3\n[cache]\nmax_batch = 10\n\
         [queries.added_later]\nsql = \"SELECT name FROM items WHERE id = $1\"\nttl_s = 30\n",
    )
    .expect("rewrite");
    hup(sidecar.pid());
    common::wait_until("the reload", Duration::from_secs(10), || {
        c.query(named.clone()).status == 200
    });
    let r = c.query(named.clone());
    assert_eq!(r.body["rows"][0]["name"], "item 3");
    assert_eq!(r.body["cache"], "hit", "the named query's TTL applies");

    // A broken file is refused whole: the query stays.
    std::fs::write(&file, "[queries.added_later\nsql = ").expect("break");
    hup(sidecar.pid());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.query(named).status, 200);
    sidecar.terminate();
    let text = std::fs::read_to_string(log.path()).expect("log");
    assert!(text.contains("configuration reloaded"), "{text}");
    assert!(
        text.contains("need a restart") && text.contains("redis"),
        "{text}"
    );
    assert!(text.contains("configuration not reloaded"), "{text}");
}

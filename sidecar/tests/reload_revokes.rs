//! An operator revokes credentials: each kind (the shared secret, an Upstash token, a Neon
//! token) is replaced in the config files, then SIGHUP. From the moment the reload is applied
//! the old ones are refused and the new ones accepted; a change that needs a restart is named
//! in the log, and the credentials in the same file are applied all the same.
use ferry_testkit::client::Client;
use ferry_testkit::{wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const OLD_SECRET: &str = "old-shared-secret-0123456789abcdef";
const NEW_SECRET: &str = "new-shared-secret-0123456789abcdef";
const OLD_UPSTASH: &str = "old-upstash-token-0123456789abcdefghij";
const NEW_UPSTASH: &str = "new-upstash-token-0123456789abcdefghij";
const OLD_NEON: &str = "old-neon-token-0123456789abcdefghijklm";
const NEW_NEON: &str = "new-neon-token-0123456789abcdefghijklm";

fn config(upstash: &str, neon: &str, redis_pool: u32) -> String {
    format!(
        "[redis]\npool_size = {redis_pool}\n\
         [upstash]\nenabled = true\nshare_cache_redis = true\n[[upstash.tokens]]\ntoken = \"{upstash}\"\nprefix = \"app:\"\n\
         [neon]\nenabled = true\n[[neon.tokens]]\ntoken = \"{neon}\"\n"
    )
}

#[test]
fn revoked_credentials_are_refused_once_the_reload_is_applied() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, secret) = (dir.path().join("ferry.toml"), dir.path().join("secret"));
    std::fs::write(&file, config(OLD_UPSTASH, OLD_NEON, 8)).expect("config");
    std::fs::write(&secret, OLD_SECRET).expect("secret");
    let log = tempfile::NamedTempFile::new().expect("log");
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_CONFIG", file.to_str().expect("utf-8")),
            ("FERRY_AUTH_SECRET_FILE", secret.to_str().expect("utf-8")),
            ("FERRY_SECRET", OLD_SECRET),
            ("FERRY_LOG", "info"),
        ],
        Stdio::from(log.reopen().expect("log")),
    );
    let old = s.client.clone();
    let new = Client::new(&old.base, NEW_SECRET);
    let read = json!({ "sql": "SELECT 1 AS one" });
    let ping = json!(["PING"]);
    let sql = json!({ "query": "SELECT 1 AS one" });
    assert_eq!(old.query(read.clone()).status, 200);
    assert_eq!(old.upstash(OLD_UPSTASH, "/", ping.clone()).status, 200);
    assert_eq!(old.neon(OLD_NEON, sql.clone(), &[]).status, 200);

    // Every credential replaced, and one change that needs a restart.
    std::fs::write(&file, config(NEW_UPSTASH, NEW_NEON, 9)).expect("config");
    std::fs::write(&secret, NEW_SECRET).expect("secret");
    assert!(Command::new("kill")
        .args(["-HUP", &s.pid().to_string()])
        .status()
        .expect("kill")
        .success());
    wait_until("the reload", Duration::from_secs(10), || {
        new.query(read.clone()).status == 200
    });
    let refused = old.query(read.clone());
    assert_eq!(refused.status, 401, "the old secret: {}", refused.body);
    let refused = old.upstash(OLD_UPSTASH, "/", ping.clone());
    assert_eq!(
        refused.status, 401,
        "the old Upstash token: {}",
        refused.body
    );
    let refused = old.neon(OLD_NEON, sql.clone(), &[]);
    assert_eq!(refused.status, 401, "the old Neon token: {}", refused.body);
    assert_eq!(new.upstash(NEW_UPSTASH, "/", ping).status, 200);
    assert_eq!(new.neon(NEW_NEON, sql, &[]).status, 200);
    let said = std::fs::read_to_string(log.path()).expect("log");
    assert!(
        said.contains("need a restart") && said.contains("redis"),
        "the pool size change is named: {said}"
    );
}

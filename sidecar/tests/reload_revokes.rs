//! An operator revokes credentials: each kind (the shared secret, an Upstash token, a Neon
//! token, the end users' JWT secret) is replaced in the config files, then SIGHUP. From the moment the reload is applied
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
const OLD_JWT: &str = "old-end-user-jwt-secret-0123456789abcdef";
const NEW_JWT: &str = "new-end-user-jwt-secret-0123456789abcdef";

fn config(upstash: &str, neon: &str, jwt: &str, redis_pool: u32) -> String {
    format!(
        "[redis]\npool_size = {redis_pool}\n\
         [identity]\nroles = [\"authenticated\"]\nallow_raw_sql = true\njwt_secret = \"{jwt}\"\n\
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
    std::fs::write(&file, config(OLD_UPSTASH, OLD_NEON, OLD_JWT, 8)).expect("config");
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
    // An end user's token (the Neon driver's authToken), signed with each JWT secret.
    let jwt = |secret: &str| {
        let t = ferry_shared::jwt::sign_hs256(
            &json!({"sub": "alice", "exp": 4_000_000_000u64}),
            secret.as_bytes(),
        );
        format!("Bearer {t}")
    };
    let (old_user, new_user) = (jwt(OLD_JWT), jwt(NEW_JWT));
    let as_user = json!({ "query": "SELECT current_user AS who" });
    let r = old.neon(
        OLD_NEON,
        as_user.clone(),
        &[("authorization", old_user.as_str())],
    );
    assert_eq!(
        (r.status, r.body["rows"][0]["who"].clone()),
        (200, json!("authenticated")),
        "{}",
        r.body
    );

    // Every credential replaced, and one change that needs a restart.
    std::fs::write(&file, config(NEW_UPSTASH, NEW_NEON, NEW_JWT, 9)).expect("config");
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
    let refused = new.neon(
        NEW_NEON,
        as_user.clone(),
        &[("authorization", old_user.as_str())],
    );
    assert_eq!(
        refused.status, 401,
        "the old JWT secret's token: {}",
        refused.body
    );
    let r = new.neon(NEW_NEON, as_user, &[("authorization", new_user.as_str())]);
    assert_eq!(r.status, 200, "the new JWT secret's token: {}", r.body);
    assert_eq!(new.upstash(NEW_UPSTASH, "/", ping).status, 200);
    assert_eq!(new.neon(NEW_NEON, sql, &[]).status, 200);
    let said = std::fs::read_to_string(log.path()).expect("log");
    assert!(
        said.contains("need a restart") && said.contains("redis"),
        "the pool size change is named: {said}"
    );
}

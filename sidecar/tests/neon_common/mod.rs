//! What the `/sql` tests share: the binary with two Neon tokens (one read-only) on a private
//! Redis and Postgres, and a POST with the driver's headers.
#![allow(dead_code)]
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::Value;
use std::process::Stdio;
pub const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
pub const TOKEN: &str = "neon-rw-token-0123456789abcdef0123456789";
pub const RO_TOKEN: &str = "neon-ro-token-0123456789abcdef0123456789";

pub fn start() -> (RedisServer, PgServer, SidecarProcess, tempfile::TempDir) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.client()
        .batch_execute(
            "CREATE TABLE neon_items (id serial PRIMARY KEY, name text UNIQUE NOT NULL, \
             qty int NOT NULL);
             CREATE TABLE victims (id int);",
        )
        .expect("schema");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("ferry.toml");
    std::fs::write(
        &config,
        format!(
            "[postgres]\npool_size = 8\n[neon]\nenabled = true\n\
             [[neon.tokens]]\ntoken = \"{TOKEN}\"\n\
             [[neon.tokens]]\ntoken = \"{RO_TOKEN}\"\nread_only = true\n"
        ),
    )
    .expect("config");
    let config = config.display().to_string();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_CONFIG", config.as_str()),
            ("FERRY_LIMITS_MAX_READ_BYTES", "1000000"),
        ],
        Stdio::null(),
    );
    (redis, pg, s, dir)
}

/// POST /sql with the driver's headers (and `extra`), over plain HTTP.
pub fn post(s: &SidecarProcess, token: &str, body: Value, extra: &[(&str, &str)]) -> (u16, Value) {
    let (status, _, body) = post_full(s, token, body, extra);
    (status, body)
}

/// The same, with the answer's headers.
pub fn post_full(
    s: &SidecarProcess,
    token: &str,
    body: Value,
    extra: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{token}@db.ferry.invalid/app");
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    s.client.block_on(async move {
        let mut r = reqwest::Client::new()
            .post(url)
            .header("Neon-Connection-String", conn)
            .header("Neon-Raw-Text-Output", "true")
            .header("Neon-Array-Mode", "true")
            .body(body.to_string());
        for (k, v) in extra {
            r = r.header(k, v);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
}

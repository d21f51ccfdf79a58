//! The Neon driver's `authToken` (Neon's row-level-security path), with the real
//! `@neondatabase/serverless`, unchanged: the sidecar verifies each end user's JWT (HS256 with
//! `identity.jwt_secret`, ES256 against a JWKS the test serves) and runs the statements as
//! that user, so the demo's `notes` policy shows and lets each write only their own. Forged,
//! expired and unknown-key tokens are refused. Postgres's rows judge.
use ferry_testkit::doors::config_file;
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use std::io::{Read, Write};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "neon-end-users-token-0123456789abcdefghij";
const SECRET: &str = "end-users-hs256-secret-0123456789abcdef";

/// Serves `file`'s contents (the provider's JWKS) to every request, on a free port.
fn jwks_server(file: std::path::PathBuf) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let body = std::fs::read(&file).unwrap_or_default();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
    });
    port
}

#[test]
fn the_drivers_auth_token_runs_statements_as_its_end_user() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    // The operator's step for this path: the token's role may take on the end users' role.
    pg.client()
        .batch_execute("GRANT authenticated TO ferry_neon")
        .expect("grant");
    let dir = tempfile::tempdir().expect("tempdir");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, "{\"keys\": []}").expect("jwks");
    let port = jwks_server(jwks.clone());
    let file = config_file(&format!(
        "[identity]\nroles = [\"authenticated\"]\nallow_raw_sql = true\n\
         jwt_secret = \"{SECRET}\"\njwks_url = \"http://127.0.0.1:{port}/jwks\"\n\
         [neon]\nenabled = true\n[[neon.tokens]]\ntoken = \"{TOKEN}\"\npostgres_url = \"{}\"\n",
        pg.url_as("ferry_neon")
    ));
    let path = file.path().to_str().expect("utf-8 path");
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url_as("ferry_app"),
        &[("FERRY_CONFIG", path)],
        Stdio::null(),
    );
    let url = format!("http://127.0.0.1:{}", s.port);
    ferry_testkit::clients::run_node(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/neon_auth.mjs"
        )),
        &[
            ("URL", url.as_str()),
            ("TOKEN", TOKEN),
            ("SECRET", SECRET),
            ("JWKS_FILE", jwks.to_str().expect("utf-8 path")),
        ],
        12,
    );
    // Postgres's rows: alice's write is hers, bob's forgery is not there.
    let rows: Vec<(String, String)> = pg
        .client()
        .query(
            "SELECT owner, body FROM notes WHERE body IN ('from /sql', 'forged')",
            &[],
        )
        .expect("notes")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, [("alice".to_string(), "from /sql".to_string())]);
}

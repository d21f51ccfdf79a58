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

/// A provider whose key set fails (500), and made-up `kid`s: the sidecar asks it once per
/// 30 s, not once per request, and every request is answered at once (401); and an end user's
/// requests count against their rate on `/sql` as on `/v1` (found by an attacker this round:
/// 40 made-up kids made 40 fetches, and `/sql` ignored identity.rate_per_s).
#[test]
fn a_failing_key_set_is_asked_once_and_end_users_keep_their_rate() {
    let (redis, pg) = (RedisServer::start(), PgServer::start());
    pg.setup_demo_schema();
    pg.client()
        .batch_execute("GRANT authenticated TO ferry_neon")
        .expect("grant");
    // A key-set server that fails every request, counting them.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = asked.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    let file = config_file(&format!(
        "[identity]\nroles = [\"authenticated\"]\nallow_raw_sql = true\n\
         jwt_secret = \"{SECRET}\"\njwks_url = \"http://127.0.0.1:{port}/jwks\"\n\
         rate_per_s = 1\nburst = 3\n\
         [neon]\nenabled = true\n[[neon.tokens]]\ntoken = \"{TOKEN}\"\npostgres_url = \"{}\"\n",
        pg.url_as("ferry_neon")
    ));
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url_as("ferry_app"),
        &[("FERRY_CONFIG", file.path().to_str().expect("utf-8 path"))],
        Stdio::null(),
    );
    let b64 = |v: serde_json::Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let body = serde_json::json!({ "query": "SELECT 1 AS one" });
    let started = std::time::Instant::now();
    for i in 0..20 {
        let made_up = format!(
            "Bearer {}.{}.c2ln",
            b64(serde_json::json!({"alg": "RS256", "kid": format!("made-up-{i}")})),
            b64(serde_json::json!({"sub": "x", "exp": 4_000_000_000u64}))
        );
        let a = s
            .client
            .neon(TOKEN, body.clone(), &[("authorization", made_up.as_str())]);
        assert_eq!(a.status, 401, "{}", a.body);
    }
    let fetches = asked.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        fetches <= 1,
        "the failing key set was asked {fetches} times for 20 tokens"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "20 requests took {:?}",
        started.elapsed()
    );
    // bob, past his burst of 3 at 1 a second: refused 429, as on /v1.
    let bob = format!(
        "Bearer {}",
        ferry_shared::jwt::sign_hs256(
            &serde_json::json!({"sub": "bob", "exp": 4_000_000_000u64}),
            SECRET.as_bytes()
        )
    );
    let statuses: Vec<u16> = (0..8)
        .map(|_| {
            s.client
                .neon(TOKEN, body.clone(), &[("authorization", bob.as_str())])
                .status
        })
        .collect();
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(statuses.iter().take(3).all(|s| *s == 200), "{statuses:?}");
}

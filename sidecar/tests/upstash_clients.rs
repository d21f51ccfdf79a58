//! The Upstash-compatible Redis REST endpoints, driven by the real clients, unchanged: npm
//! `@upstash/redis` and PyPI `upstash-redis` (installed by scripts/test.sh into
//! FERRY_CLIENTS_DIR and FERRY_PY_CLIENTS_DIR), against the binary and a Redis of the door's
//! own (`upstash.redis_url`). Redis's own keys judge the namespaces.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "rw-token-0123456789abcdef0123456789abcdef";
const RO_TOKEN: &str = "ro-token-0123456789abcdef0123456789abcdef";
const SCRIPTS: &str = "script_user = \"app-scripts\"\nscript_password = \"script-password\"\n";
const OTHER_TOKEN: &str = "other-token-0123456789abcdef0123456789abcd";

/// The door's own Redis, the cache's Redis, Postgres and the binary with three tokens:
/// read-write and read-only on `app:`, and read-write on `other:`. The temp dir holds the config.
struct Setup {
    door: RedisServer,
    _cache: RedisServer,
    _pg: PgServer,
    s: SidecarProcess,
    _dir: tempfile::TempDir,
}

fn start() -> Setup {
    start_with(None)
}

/// With `tokens` (config text) in place of the three tokens.
fn start_with(tokens: Option<&str>) -> Setup {
    let (cache, door) = (RedisServer::start(), RedisServer::start());
    let pg = PgServer::start();
    // The script user the operator makes (deploy/ferry.toml): this namespace's keys only, no
    // listing keys, changing database or reaching the server (Ferry checks it: ACL DRYRUN).
    let _: () = ::redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "app-scripts",
            "on",
            ">script-password",
            "resetkeys",
            "~app:*",
            "+@all",
            "-@dangerous",
            "-@keyspace",
            "-select",
            "-memory",
            "-georadius",
            "-georadiusbymember",
            "-@pubsub",
            "+del",
            "+exists",
            "+expire",
            "+pexpire",
            "+ttl",
            "+pttl",
            "+type",
        ])
        .query(&mut door.conn())
        .expect("acl user");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("ferry.toml");
    std::fs::write(
        &config,
        format!(
            "[upstash]\nenabled = true\nredis_url = \"{}\"\n{}",
            door.url(),
            tokens.map(str::to_string).unwrap_or_else(|| format!(
                "[[upstash.tokens]]\ntoken = \"{TOKEN}\"\nprefix = \"app:\"\n{SCRIPTS}\
                 [[upstash.tokens]]\ntoken = \"{RO_TOKEN}\"\nprefix = \"app:\"\nread_only = true\n{SCRIPTS}\
                 [[upstash.tokens]]\ntoken = \"{OTHER_TOKEN}\"\nprefix = \"other:\"\n"
            ))
        ),
    )
    .expect("config");
    let config = config.display().to_string();
    let s = SidecarProcess::start(
        BIN,
        &cache.url(),
        &pg.url(),
        &[("FERRY_CONFIG", config.as_str())],
        Stdio::null(),
    );
    Setup {
        door,
        _cache: cache,
        _pg: pg,
        s,
        _dir: dir,
    }
}

#[test]
fn the_real_python_client_works_unchanged() {
    let clients = ferry_testkit::clients::dir("FERRY_PY_CLIENTS_DIR");
    let setup = start();
    let s = &setup.s;
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/upstash.py"
        ))
        .env("PYTHONPATH", clients)
        .env("URL", format!("http://127.0.0.1:{}", s.port))
        .env("TOKEN", TOKEN)
        .env("RO_TOKEN", RO_TOKEN)
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the client's checks failed:\n{text}");
    assert!(text.lines().count() >= 19, "too few checks ran:\n{text}");
}

#[test]
fn the_real_upstash_client_works_unchanged() {
    let Setup { door: redis, s, .. } = start();
    let url = format!("http://127.0.0.1:{}", s.port);
    ferry_testkit::clients::run_node(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/upstash.mjs"
        )),
        &[
            ("URL", url.as_str()),
            ("TOKEN", TOKEN),
            ("RO_TOKEN", RO_TOKEN),
            ("OTHER_TOKEN", OTHER_TOKEN),
        ],
        30,
    );

    // What the client cannot send: refused commands, shapes and statuses, over plain HTTP.
    let post = |path: &str, body: serde_json::Value, token: Option<&str>, b64: bool| {
        let url = format!("http://127.0.0.1:{}{path}", s.port);
        s.client.block_on(async move {
            let mut r = reqwest::Client::new().post(url).json(&body);
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            if b64 {
                r = r.header("Upstash-Encoding", "base64");
            }
            let resp = r.send().await.expect("send");
            let status = resp.status().as_u16();
            let sync = resp.headers().contains_key("upstash-sync-token");
            (
                status,
                resp.json::<serde_json::Value>().await.expect("json"),
                sync,
            )
        })
    };
    for refused in [
        json!(["BLPOP", "l", "1"]),
        json!(["MONITOR"]),
        json!(["SUBSCRIBE", "c"]),
        json!(["CONFIG", "GET", "*"]),
        json!(["SHUTDOWN"]),
        json!(["DEBUG", "SLEEP", "0"]),
        json!(["SELECT", "1"]),
        json!(["WATCH", "a"]),
        json!(["XREAD", "BLOCK", "0", "STREAMS", "s", "$"]),
        json!(["SORT", "l", "BY", "weight_*"]),
        json!(["FUNCTION", "FLUSH"]),
        json!(["SCRIPT", "FLUSH"]),
    ] {
        let (status, body, _) = post("/", refused.clone(), Some(TOKEN), false);
        assert_eq!(status, 400, "{refused}: {body}");
        let e = body["error"].as_str().unwrap_or_default();
        assert!(e.contains("not allowed"), "{refused}: {body}");
    }
    let (status, body, _) = post("/", json!(["GET", "greeting"]), None, false);
    assert_eq!((status, body), (401, json!({"error": "Unauthorized"})));
    let (status, body, sync) = post(
        "/pipeline",
        json!([
            ["SET", "p", "v"],
            ["CONFIG", "GET", "x"],
            ["GET", "p"],
            ["INCR", "p"]
        ]),
        Some(TOKEN),
        false,
    );
    assert_eq!(status, 200);
    assert!(sync, "the sync token round-trips");
    assert_eq!(body[0], json!({"result": "OK"}));
    assert!(body[1]["error"]
        .as_str()
        .unwrap_or_default()
        .contains("not allowed"));
    assert_eq!(body[2], json!({"result": "v"}));
    assert_eq!(
        body[3],
        json!({"error": "ERR value is not an integer or out of range"})
    );
    let (status, _, _) = post(
        "/multi-exec",
        json!([["SET", "m", "1"], ["MONITOR"]]),
        Some(TOKEN),
        false,
    );
    assert_eq!(
        status, 400,
        "a refused command refuses the whole transaction"
    );
    let (_, body, _) = post("/", json!(["GET", "m"]), Some(TOKEN), false);
    assert_eq!(body, json!({"result": null}), "nothing of it ran");
    post(
        "/",
        json!(["RPUSH", "nested", "a", "b"]),
        Some(TOKEN),
        false,
    );
    let (_, body, _) = post("/", json!(["LRANGE", "nested", 0, -1]), Some(TOKEN), true);
    assert_eq!(
        body,
        json!({"result": ["YQ==", "Yg=="]}),
        "base64 inside arrays"
    );

    // Keys that move (counted, after a keyword) go in the namespace, and replies that name
    // keys come back without it.
    let run = |body: serde_json::Value| post("/", body, Some(TOKEN), false).1;
    run(json!(["ZADD", "za", 1, "x"]));
    run(json!(["ZADD", "zb", 2, "x"]));
    assert_eq!(
        run(json!(["ZUNIONSTORE", "zu", 2, "za", "zb"])),
        json!({"result": 1})
    );
    assert_eq!(run(json!(["ZSCORE", "zu", "x"])), json!({"result": "3"}));
    run(json!(["RPUSH", "la", "1", "2"]));
    assert_eq!(
        run(json!(["LMPOP", 2, "nothing", "la", "LEFT"])),
        json!({"result": ["la", ["1"]]})
    );
    run(json!(["XADD", "xs", "1-1", "f", "v"]));
    assert_eq!(
        run(json!(["XREAD", "COUNT", 1, "STREAMS", "xs", "0"])),
        json!({"result": [["xs", [["1-1", ["f", "v"]]]]]})
    );
    let (_, scanned, _) = post(
        "/",
        json!(["SCAN", 0, "MATCH", "z*", "COUNT", 1000]),
        Some(TOKEN),
        false,
    );
    let mut names: Vec<String> =
        serde_json::from_value(scanned["result"][1].clone()).expect("scan keys");
    names.sort();
    assert_eq!(names, ["z", "za", "zb", "zu"], "{scanned}");
    // A command in the path, as Upstash's docs send them.
    let (status, path_set) = s.client.block_on(async {
        let r = reqwest::Client::new()
            .get(format!(
                "http://127.0.0.1:{}/set/path%20key/v%2F1?EX=100",
                s.port
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("send");
        (
            r.status().as_u16(),
            r.json::<serde_json::Value>().await.expect("json"),
        )
    });
    assert_eq!((status, path_set), (200, json!({"result": "OK"})));
    assert_eq!(run(json!(["GET", "path key"])), json!({"result": "v/1"}));
    assert_eq!(
        run(json!(["TTL", "path key"]))["result"]
            .as_i64()
            .map(|t| t > 90),
        Some(true)
    );

    // Redis's view: every key the clients wrote sits in its token's namespace.
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.conn())
        .expect("keys");
    assert!(keys.contains(&"app:greeting".to_string()), "{keys:?}");
    // The other token's FLUSHDB emptied its namespace and nothing else.
    assert!(!keys.iter().any(|k| k.starts_with("other:")), "{keys:?}");
    let stray: Vec<&String> = keys
        .iter()
        .filter(|k| !k.starts_with("app:") && !k.starts_with("other:"))
        .collect();
    assert!(stray.is_empty(), "keys outside the namespaces: {stray:?}");
}

/// The libraries built on the client, unchanged: `@upstash/ratelimit` (every limiter, exactly
/// the limit admitted among concurrent callers; its scripts carry `#!lua
/// flags=allow-key-locking`, which Redis 7 refuses unless the door drops the flag) and
/// `@upstash/lock`: on a namespaced token with a script user (Redis's keys judge the
/// namespace), and on a token that owns the whole database.
#[test]
fn the_libraries_built_on_the_client_work_unchanged() {
    let script = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/libraries.mjs"
    ));
    let Setup { door: redis, s, .. } = start();
    let url = format!("http://127.0.0.1:{}", s.port);
    ferry_testkit::clients::run_node(script, &[("URL", url.as_str()), ("TOKEN", TOKEN)], 25);
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.conn())
        .expect("keys");
    assert!(keys.iter().any(|k| k.starts_with("app:rl-")), "{keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("app:")), "{keys:?}");

    // A whole-database token's scripts run as a script user of every key, one database.
    let whole = start_with(Some(&format!(
        "[[upstash.tokens]]\ntoken = \"{TOKEN}\"\nprefix = \"\"\n\
         script_user = \"all-scripts\"\nscript_password = \"script-password\"\n"
    )));
    let _: () = ::redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "all-scripts",
            "on",
            ">script-password",
            "resetkeys",
            "~*",
            "+@all",
            "-@dangerous",
            "-select",
            "-copy",
            "-move",
            "-memory",
            "-georadius",
            "-georadiusbymember",
            "-@pubsub",
        ])
        .query(&mut whole.door.conn())
        .expect("acl user");
    let url = format!("http://127.0.0.1:{}", whole.s.port);
    ferry_testkit::clients::run_node(
        script,
        &[("URL", url.as_str()), ("TOKEN", TOKEN), ("WHOLE", "1")],
        25,
    );
}

/// A Redis that stops answering (SIGSTOP): Upstash requests get a fast Upstash-shaped error,
/// not a hang, and work again once it answers.
#[test]
fn a_hung_redis_gets_fast_answers() {
    let Setup { door: redis, s, .. } = start();
    let post = |body: serde_json::Value| {
        let url = format!("http://127.0.0.1:{}/", s.port);
        s.client.block_on(async move {
            let t = std::time::Instant::now();
            let resp = reqwest::Client::new()
                .post(url)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .expect("send");
            let status = resp.status().as_u16();
            let retry_after = resp.headers().contains_key("retry-after");
            let v = resp.json::<serde_json::Value>().await.expect("json");
            (status, v, t.elapsed(), retry_after)
        })
    };
    assert_eq!(post(json!(["SET", "k", "v"])).0, 200);
    redis.pause();
    let (status, body, took, retry_after) = post(json!(["GET", "k"]));
    let (status2, _, took2, _) = post(json!(["GET", "k"]));
    redis.resume();
    assert_eq!(status, 503, "{body}");
    // Through the one error path: Retry-After like every 503, and Redis's words, not the
    // driver's (which name addresses).
    assert!(retry_after, "a 503 without Retry-After");
    assert_eq!(body, json!({"error": "ERR redis is unavailable"}));
    assert_eq!(status2, 503);
    assert!(
        took < std::time::Duration::from_secs(3) && took2 < std::time::Duration::from_secs(3),
        "{took:?} / {took2:?}"
    );
    ferry_testkit::wait_until(
        "redis to answer again",
        std::time::Duration::from_secs(10),
        || post(json!(["GET", "k"])).1 == json!({"result": "v"}),
    );
    println!("FIGURES hung redis: 503 in {took:?}, then {took2:?}");
}

//! A plain JavaScript Worker in workerd (`wrangler dev`), examples/js-worker, using the real
//! `@neondatabase/serverless` and `@upstash/redis` clients unchanged against the binary: the
//! JS world's code works with Ferry by changing its URLs. Postgres and Redis judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess, WranglerDev};
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const NEON_TOKEN: &str = "js-worker-neon-token-0123456789abcdef0123";
const UPSTASH_TOKEN: &str = "js-worker-upstash-token-0123456789abcdef01";

#[test]
fn a_js_worker_uses_both_clients_unchanged() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_NEON_ENABLED", "true"),
            ("FERRY_NEON_TOKEN", NEON_TOKEN),
            ("FERRY_UPSTASH_ENABLED", "true"),
            ("FERRY_UPSTASH_SHARE_CACHE_REDIS", "true"),
            ("FERRY_UPSTASH_TOKEN", UPSTASH_TOKEN),
        ],
        Stdio::null(),
    );
    let sidecar = format!("http://127.0.0.1:{}", s.port);
    let sql_endpoint = format!("{sidecar}/sql");
    let database_url = format!("postgresql://app:{NEON_TOKEN}@db.ferry.invalid/app");
    let main = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/js-worker/src/index.js");
    let modules = ferry_testkit::clients::node_modules();
    let worker = WranglerDev::start_worker(
        &main,
        &[
            ("FERRY_SQL_ENDPOINT", sql_endpoint.as_str()),
            ("DATABASE_URL", database_url.as_str()),
            ("UPSTASH_REDIS_REST_URL", sidecar.as_str()),
        ],
        &[("UPSTASH_REDIS_REST_TOKEN", UPSTASH_TOKEN)],
        Some(&modules),
    );
    let get = |path: &str| -> (u16, Value) {
        let url = format!("{}{path}", worker.url());
        s.client.block_on(async move {
            let r = reqwest::get(url).await.expect("get");
            let status = r.status().as_u16();
            let text = r.text().await.expect("body");
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        })
    };
    let (status, body) = get("/item?id=7");
    assert_eq!(status, 200, "{body}\n{}", worker.log());
    let name: String = pg
        .client()
        .query_one("SELECT name FROM items WHERE id = 7", &[])
        .expect("row")
        .get(0);
    assert_eq!(body["item"]["name"], name.as_str(), "{body}");
    assert_eq!(body["item"]["id"], 7, "int4 parsed by the driver: {body}");

    for n in 1..=3 {
        let (status, body) = get("/both?id=3");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["visits"], n, "{body}");
        assert_eq!(body["item"]["id"], 3, "{body}");
    }
    // Redis's view: the counter sits in the token's namespace.
    let visits: i64 = ::redis::cmd("GET")
        .arg("ferry:u:default:visits:3")
        .query(&mut redis.conn())
        .expect("counter");
    assert_eq!(visits, 3);
    let (status, body) = get("/item?id=0");
    assert_eq!(status, 400, "{body}");
    let (status, body) = get("/item?id=999999");
    assert_eq!(status, 404, "{body}");
    // Postgres's view: the Worker's requests shared the sidecar's few sessions.
    assert!(pg.sidecar_backends() <= 10, "more sessions than the pool");
}

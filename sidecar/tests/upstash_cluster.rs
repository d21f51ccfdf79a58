//! The Upstash-compatible endpoints on a Redis Cluster, driven by the real npm `@upstash/redis`
//! client, unchanged: single commands, pipelines split by slot and answered in order, errors as
//! their own answers, multi-key commands and transactions within a slot (CROSSSLOT across, as
//! Redis Cluster itself answers), scripts refused. Redis's own keys judge where they went.
use ferry_testkit::{PgServer, RedisCluster, SidecarProcess};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "rw-token-0123456789abcdef0123456789abcdef";

#[test]
fn the_real_upstash_client_works_on_a_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let pg = PgServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("ferry.toml");
    std::fs::write(
        &config,
        format!(
            "[upstash]\nenabled = true\nshare_cache_redis = true\n[[upstash.tokens]]\ntoken = \"{TOKEN}\"\nprefix = \"app:\"\n\
             script_user = \"app-scripts\"\nscript_password = \"script-password\"\n"
        ),
    )
    .expect("config");
    let config = config.display().to_string();
    let s = SidecarProcess::start(
        BIN,
        &cluster.urls(),
        &pg.url(),
        &[
            ("FERRY_CONFIG", config.as_str()),
            ("FERRY_REDIS_CLUSTER", "true"),
        ],
        Stdio::null(),
    );
    let url = format!("http://127.0.0.1:{}", s.port);
    ferry_testkit::clients::run_node(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/upstash_cluster.mjs"
        )),
        &[("URL", url.as_str()), ("TOKEN", TOKEN)],
        11,
    );
    // One request cannot affect another: a cached read of another caller stays a hit while a
    // hostile Upstash caller sends what a cluster refuses (each refusal is that caller's own
    // answer, never a Redis failure that would send every read past the cache).
    let read = serde_json::json!({"sql": "SELECT 1 AS one", "cache": {"ttl_s": 300}});
    s.client.query(read.clone());
    assert_eq!(s.client.query(read.clone()).body["cache"], "hit");
    let upstash = |path: &str, body: serde_json::Value| {
        let url = format!("http://127.0.0.1:{}{path}", s.port);
        s.client.block_on(async move {
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .expect("send");
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.expect("json"),
            )
        })
    };
    let hostile = [
        (
            "/",
            serde_json::json!(["MGET", "k1", "k2", "k3", "k4", "k5"]),
        ),
        ("/", serde_json::json!(["SUNIONSTORE", "k1", "k2", "k3"])),
        (
            "/multi-exec",
            serde_json::json!([["SET", "k1", "1"], ["SET", "k2", "2"]]),
        ),
        (
            "/pipeline",
            serde_json::json!([
                ["PING"],
                ["MGET", "k1", "k2", "k3"],
                ["INCR", "greeting"],
                ["EVAL", "return 1", "0"],
                ["ECHO", "x"]
            ]),
        ),
    ];
    for (path, body) in hostile {
        let (status, answer) = upstash(path, body.clone());
        assert!(
            status == 200 || status == 400,
            "{path} {body}: {status} {answer}"
        );
        let after = s.client.query(read.clone());
        assert_eq!(
            after.body["cache"], "hit",
            "after {path} {body} ({status} {answer}) another caller's read lost the cache: {}",
            after.body
        );
    }
    // Redis's view: the client's keys, in the token's namespace, on every master.
    let masters: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| !cluster.replicas_of(i).is_empty())
        .collect();
    for m in masters {
        let keys = cluster.keys_matching(m, "ferry:u:app:k*");
        assert!(
            !keys.is_empty(),
            "master {m} holds none of the pipeline's keys"
        );
    }
}

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
            "[upstash]\nenabled = true\n[[upstash.tokens]]\ntoken = \"{TOKEN}\"\nprefix = \"app:\"\n\
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

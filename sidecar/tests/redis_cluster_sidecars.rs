//! Two sidecar binaries on one Redis Cluster keep their cross-sidecar promises there too: a
//! signed read accepted by one is refused as a replay by the other (the nonce set lives on one
//! master, reached over each sidecar's cluster connection), and identical misses spread over
//! both run on Postgres once (the fill lease on its slot's master; the wake-up published on one
//! node reaches the other sidecar's subscriber, listening on another). Postgres's own count of
//! executions judges.
use ferry_testkit::client::{nonce, now_s};
use ferry_testkit::{PgServer, RedisCluster, SidecarProcess};
use serde_json::json;
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn replays_and_single_flight_hold_across_sidecars_on_a_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let env = [
        ("FERRY_REDIS_CLUSTER", "true"),
        ("FERRY_SERVER_MAX_IN_FLIGHT", "1024"),
    ];
    let s: Vec<SidecarProcess> = (0..2)
        .map(|_| SidecarProcess::start(BIN, &cluster.urls(), &pg.url(), &env, Stdio::null()))
        .collect();
    let (a, b) = (&s[0].client, &s[1].client);

    // A replay of a read, to the other sidecar.
    let body =
        serde_json::to_vec(&json!({"sql": "SELECT name FROM items WHERE id = 1"})).expect("json");
    let h = a.headers_for("POST", "/v1/query", &body, now_s(), &nonce());
    assert_eq!(a.raw("POST", "/v1/query", body.clone(), &h).status, 200);
    let replay = b.raw("POST", "/v1/query", body, &h);
    assert_eq!(
        (replay.status, replay.code()),
        (401, "auth_replayed"),
        "{}",
        replay.body
    );

    // 200 identical misses, half on each sidecar, while the first one's query runs.
    let req = json!({
        "sql": "SELECT ferry_test_touch() AS n, pg_sleep(1)::text AS slept",
        "cache": {"ttl_s": 60}
    });
    let answers = a.block_on(async {
        let all = (0..200).map(|i| [a, b][i % 2].query_async(req.clone()));
        futures::future::join_all(all).await
    });
    let failed = answers.iter().filter(|r| r.status != 200).count();
    assert_eq!(
        failed,
        0,
        "{:?}",
        answers.iter().find(|r| r.status != 200).map(|r| &r.body)
    );
    assert_eq!(pg.reads(), 1, "Postgres ran the miss more than once");
}

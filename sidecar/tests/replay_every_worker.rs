//! A replay is refused by every worker of another sidecar, including one that has no
//! multiplexed Redis connection of its own. With `redis.pool_size = 2` a sidecar keeps one
//! multiplexed connection (half the pool), so one of its two workers sends its commands on a
//! pooled connection (`store::pools::send`). Each replay goes on a new connection, which actix
//! hands to its workers in turn: reads and cache reads accepted by one sidecar are refused by
//! both workers of the other. And a replay is refused when Redis has ended the other
//! sidecar's connections since its last request (`CLIENT KILL`, an idle `timeout`): the check
//! goes again on a fresh connection, never skipped while Redis is up.
use ferry_testkit::client::{nonce, now_s};
use ferry_testkit::{Client, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

/// Replays of each request, each on a new connection: both workers see several.
const REPLAYS: usize = 6;

/// Sends `body` signed to `first`, then the same bytes and headers to `other` [`REPLAYS`]
/// times, each on a connection of its own. Returns each replay's (status, code).
fn send_then_replay(
    first: &Client,
    other: &Client,
    path: &str,
    body: &serde_json::Value,
) -> Vec<(u16, String)> {
    let body = serde_json::to_vec(body).expect("json");
    let mut h = first.headers_for("POST", path, &body, now_s(), &nonce());
    h.push(("connection", "close".into()));
    first.block_on(async {
        let a = first.send_raw("POST", path, body.clone(), &h).await;
        assert_eq!(a.status, 200, "the original is served: {}", a.body);
        let mut replays = Vec::new();
        for _ in 0..REPLAYS {
            let r = other.send_raw("POST", path, body.clone(), &h).await;
            replays.push((r.status, r.code().to_string()));
        }
        replays
    })
}

#[test]
fn every_worker_refuses_a_replay_whatever_its_redis_connection() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let env = [("FERRY_REDIS_POOL_SIZE", "2")];
    let (a, b) = (
        SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null()),
        SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null()),
    );
    let refused = |replays: &[(u16, String)]| {
        replays
            .iter()
            .all(|(status, code)| *status == 401 && code == "auth_replayed")
    };
    for i in 0..4 {
        let read = json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [1 + i],
                          "cache": {"ttl_s": 60, "key": format!("item{}", 1 + i)}});
        let replays = send_then_replay(&a.client, &b.client, "/v1/query", &read);
        assert!(refused(&replays), "read replay {i}: {replays:?}");
        let get = json!({"op": "get", "key": format!("k{i}")});
        let replays = send_then_replay(&a.client, &b.client, "/v1/cache", &get);
        assert!(refused(&replays), "cache get replay {i}: {replays:?}");
        let batch = json!({"reads": [{"sql": "SELECT name FROM items WHERE id = 1",
                                       "cache": {"ttl_s": 60, "key": "item1"}}]});
        let replays = send_then_replay(&a.client, &b.client, "/v1/batch", &batch);
        assert!(refused(&replays), "batch replay {i}: {replays:?}");
    }
    // And the reads themselves are served by both workers of each (a fresh request each).
    for c in [&a.client, &b.client] {
        for id in 1..=4 {
            let body = json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [id],
                              "cache": {"ttl_s": 60, "key": format!("item{id}")}});
            let bytes = serde_json::to_vec(&body).expect("json");
            let mut h = c.signed_now("POST", "/v1/query", &bytes);
            h.push(("connection", "close".into()));
            let r = c.block_on(c.send_raw("POST", "/v1/query", bytes, &h));
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.body["cache"], "hit", "filled above: {}", r.body);
        }
    }
}

/// The replay arrives at a sidecar whose Redis connections Redis ended since its last request
/// (an operator's `CLIENT KILL`, or Redis's idle `timeout`, common on hosted Redis): its first
/// try meets the closed connection, and the check goes again on a fresh one.
#[test]
fn a_replay_is_refused_after_redis_ended_the_connections() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let env = [("FERRY_SERVER_WORKERS", "1")];
    let (a, b) = (
        SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null()),
        SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null()),
    );
    // A connection of its own each time: Redis's idle timeout ends the test's too.
    let admin = || {
        redis::Client::open(redis.url().as_str())
            .and_then(|c| c.get_connection())
            .expect("redis")
    };
    let requests = [
        (
            "/v1/query",
            json!({"sql": "SELECT name FROM items WHERE id = 1",
                   "cache": {"ttl_s": 60, "key": "item1"}}),
        ),
        ("/v1/cache", json!({"op": "get", "key": "k"})),
        (
            "/v1/batch",
            json!({"reads": [{"sql": "SELECT name FROM items WHERE id = 2",
                              "cache": {"ttl_s": 60, "key": "item2"}}]}),
        ),
    ];
    for ending in ["CLIENT KILL", "idle timeout"] {
        for (path, body) in &requests {
            // Both sidecars have used their connections.
            for s in [&a, &b] {
                assert_eq!(
                    s.client.cache(json!({"op": "get", "key": "warm"})).status,
                    200
                );
            }
            let bytes = serde_json::to_vec(body).expect("json");
            let h = a
                .client
                .headers_for("POST", path, &bytes, now_s(), &nonce());
            let first = a
                .client
                .block_on(a.client.send_raw("POST", path, bytes.clone(), &h));
            assert_eq!(first.status, 200, "{}", first.body);
            match ending {
                "CLIENT KILL" => {
                    let _: redis::Value = redis::cmd("CLIENT")
                        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
                        .query(&mut admin())
                        .expect("client kill");
                }
                _ => {
                    let _: () = redis::cmd("CONFIG")
                        .arg(&["SET", "timeout", "1"])
                        .query(&mut admin())
                        .expect("config set");
                    // Redis closes connections idle past the timeout on its own clock.
                    std::thread::sleep(std::time::Duration::from_millis(2_500));
                    let _: () = redis::cmd("CONFIG")
                        .arg(&["SET", "timeout", "0"])
                        .query(&mut admin())
                        .expect("config set");
                }
            }
            let r = b
                .client
                .block_on(b.client.send_raw("POST", path, bytes, &h));
            assert_eq!(
                (r.status, r.code()),
                (401, "auth_replayed"),
                "{ending}, {path}: {}",
                r.body
            );
        }
    }
}

//! A cache write that ran in Redis but whose reply never came back (the network dropped it,
//! then reset the connection; or it never came before the command's timeout) may have run:
//! the answer must say so (503 `outcome_unknown`), never `cache_unavailable`, which a caller
//! reads as "nothing ran" and sends again: an INCR would count twice. The sidecar binary reaches
//! Redis through a proxy that drops replies; Redis's own count judges.
use ferry_testkit::{CutProxy, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const UPSTASH_TOKEN: &str = "reply-lost-upstash-token-0123456789abcdef";

fn counter(redis: &RedisServer) -> Option<String> {
    redis::cmd("GET")
        .arg("ferry:k:hits")
        .query(&mut redis.conn())
        .expect("get")
}

#[test]
fn an_incr_whose_reply_is_lost_is_answered_as_possibly_run() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], redis.port)));
    let s = SidecarProcess::start(
        BIN,
        &format!("redis://{}/", proxy.addr),
        &pg.url(),
        // Local replay protection: the INCR's own round trip is the only one to Redis. One
        // worker: the connection the first INCR opened is the one the next ones take.
        &[
            ("FERRY_AUTH_REPLAY", "local"),
            ("FERRY_SERVER_WORKERS", "1"),
            ("FERRY_UPSTASH_ENABLED", "true"),
            ("FERRY_UPSTASH_SHARE_CACHE_REDIS", "true"),
            ("FERRY_UPSTASH_TOKEN", UPSTASH_TOKEN),
        ],
        Stdio::null(),
    );
    let incr = || s.client.cache(json!({"op": "incr", "key": "hits"}));
    assert_eq!(incr().status, 200, "connections open");

    // The reply dropped, then the connection reset: "connection reset" after the INCR ran.
    proxy.mute();
    let body = json!({"op": "incr", "key": "hits"});
    let a = s.client.block_on(async {
        let sent = s.client.post("/v1/cache", &body);
        let reset = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            proxy.reset();
        };
        futures::future::join(sent, reset).await.0
    });
    proxy.unmute();
    assert_eq!(
        counter(&redis).as_deref(),
        Some("2"),
        "Redis ran it: {}",
        a.body
    );
    assert_eq!(
        (a.status, a.code()),
        (503, "outcome_unknown"),
        "an INCR that ran, after a reset: {}",
        a.body
    );

    // The reply dropped until the command's timeout (redis.io_timeout_ms, 1 s).
    assert_eq!(incr().status, 200, "a fresh connection");
    proxy.mute();
    let a = incr();
    proxy.unmute();
    assert_eq!(counter(&redis).as_deref(), Some("4"), "Redis ran it");
    assert_eq!(
        (a.status, a.code()),
        (503, "outcome_unknown"),
        "an INCR that ran, after a timeout: {}",
        a.body
    );

    // The same INCR over the Upstash-compatible route (its namespace is `u:` + the token's).
    let upstash = || {
        s.client.block_on(async {
            let r = reqwest::Client::new()
                .post(format!("http://127.0.0.1:{}/", s.port))
                .bearer_auth(UPSTASH_TOKEN)
                .body(json!(["INCR", "hits"]).to_string())
                .send()
                .await
                .expect("send to the upstash route");
            let status = r.status().as_u16();
            (
                status,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        })
    };
    assert_eq!(upstash().0, 200);
    proxy.mute();
    let (status, body) = upstash();
    proxy.unmute();
    let ran: i64 = upstash().1["result"].as_i64().unwrap_or_default();
    assert_eq!(ran, 3, "Redis ran the muted one: {body}");
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|m| m.contains("may have run")),
        "an INCR that ran, after a timeout: {body}"
    );

    // Reply dropped, then the connection reset: a lost connection, where reads are sent again.
    // This write must not be: Redis counts it once. (First, connections open again after the
    // timeout above, so the muted call does not wait on a handshake.)
    upstash();
    let before = upstash().1["result"].as_i64().unwrap_or_default();
    proxy.mute();
    let (status, body) = s.client.block_on(async {
        let sent = async {
            let r = reqwest::Client::new()
                .post(format!("http://127.0.0.1:{}/", s.port))
                .bearer_auth(UPSTASH_TOKEN)
                .body(json!(["INCR", "hits"]).to_string())
                .send()
                .await
                .expect("send to the upstash route");
            let status = r.status().as_u16();
            (
                status,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        };
        let reset = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            proxy.reset();
        };
        futures::future::join(sent, reset).await.0
    });
    proxy.unmute();
    let ran: i64 = upstash().1["result"].as_i64().unwrap_or_default();
    assert_eq!(ran, before + 2, "the INCR ran once, not resent: {body}");
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|m| m.contains("may have run")),
        "an INCR that ran, after a reset: {body}"
    );
}

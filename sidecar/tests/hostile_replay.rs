//! The holder of a captured request (on the network path, or a careless caller) replays it
//! against the binary's replay store: under concurrent load every replay is refused and every
//! fresh request served; a replay outside the clock window is refused as expired.
use ferry_testkit::client::{nonce, now_s};
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn every_replay_is_refused_under_load_and_every_fresh_request_served() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[("FERRY_AUTH_MAX_SKEW_S", "2")],
        Stdio::null(),
    );
    let c = &s.client;
    let path = "/v1/cache";
    let body = serde_json::to_vec(&json!({"op": "get", "key": "k"})).expect("json");
    let (fresh, replays) = c.block_on(async {
        let workers = (0..32).map(|_| {
            let body = body.clone();
            async move {
                let mut out = (Vec::new(), Vec::new());
                for _ in 0..40 {
                    let h = c.headers_for("POST", path, &body, now_s(), &nonce());
                    out.0.push(c.send_raw("POST", path, body.clone(), &h).await);
                    // The same request again, at once and twice concurrently.
                    let (a, b) = futures::future::join(
                        c.send_raw("POST", path, body.clone(), &h),
                        c.send_raw("POST", path, body.clone(), &h),
                    )
                    .await;
                    out.1.push(a);
                    out.1.push(b);
                }
                out
            }
        });
        let all = futures::future::join_all(workers).await;
        let mut fresh = Vec::new();
        let mut replays = Vec::new();
        for (f, r) in all {
            fresh.extend(f);
            replays.extend(r);
        }
        (fresh, replays)
    });
    let served = fresh.iter().filter(|a| a.status == 200).count();
    let refused = replays
        .iter()
        .filter(|a| a.status == 401 && a.code() == "auth_replayed")
        .count();
    println!(
        "FIGURES replays: {served}/{} fresh requests served, {refused}/{} replays refused",
        fresh.len(),
        replays.len()
    );
    assert_eq!(served, fresh.len(), "every fresh request is served");
    assert_eq!(
        refused,
        replays.len(),
        "every replay is refused as a replay"
    );

    // Past the clock window, the captured request is refused as expired.
    let h = c.headers_for("POST", path, &body, now_s(), &nonce());
    assert_eq!(c.raw("POST", path, body.clone(), &h).status, 200);
    std::thread::sleep(Duration::from_millis(3_500));
    let late = c.raw("POST", path, body.clone(), &h);
    assert_eq!(late.status, 401);
    assert_eq!(late.code(), "auth_expired");
}

//! A deferred invalidation outlives the sidecar that deferred it and reaches every sidecar's
//! reads. The adversary: a network partition between one sidecar and Redis (Redis itself stays
//! up with its data), a write acknowledged `deferred` through that sidecar, and then its death
//! by SIGKILL, so its memory of the invalidation is gone. Another sidecar, still connected to
//! Redis, must stop serving the pre-write entry within a bound. Postgres's rows judge.
use ferry_testkit::{CutProxy, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn an_invalidation_deferred_by_a_sidecar_that_dies_reaches_the_others() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let proxy = CutProxy::start(([127, 0, 0, 1], redis.port).into());
    // As deployed: logged in as the least-privilege role (scripts/demo.sql), which cannot
    // create tables, so the deferrals table's grants are what this test relies on.
    let app_url = pg.url().replace("postgres@", "ferry_app@");
    let start = |url: &str| SidecarProcess::start(BIN, url, &app_url, &[], Stdio::null());
    let mut cut_off = start(&format!("redis://{}", proxy.addr));
    let other = start(&redis.url());
    let read = json!({"sql": "SELECT name FROM items WHERE id = 7",
                      "cache": {"ttl_s": 300, "key": "seven", "tags": ["items7"]}});
    assert_eq!(other.client.query(read.clone()).body["cache"], "miss");
    let hit = other.client.query(read.clone());
    assert_eq!(
        (
            hit.body["cache"].as_str(),
            hit.body["rows"][0]["name"].as_str()
        ),
        (Some("hit"), Some("item 7"))
    );

    proxy.cut();
    let w = cut_off.client.execute(json!({
        "sql": "UPDATE items SET name = 'after the partition' WHERE id = 7",
        "invalidate": {"keys": ["seven"], "tags": ["items7"]}
    }));
    assert_eq!(w.status, 200, "{}", w.body);
    assert_eq!(w.body["invalidation"], "deferred", "{}", w.body);
    let name: String = pg
        .client()
        .query_one("SELECT name FROM items WHERE id = 7", &[])
        .expect("row")
        .get(0);
    assert_eq!(name, "after the partition", "the write committed");

    // The sidecar that deferred it dies; its memory goes with it.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &cut_off.pid().to_string()])
        .status();
    let _ = cut_off.child.wait();

    // The other sidecar serves the new row within the bound (a persisted deferral is applied
    // by whichever sidecar reaches Redis first, within a second), never the old one after it.
    let started = Instant::now();
    loop {
        let a = other.client.query(read.clone());
        assert_eq!(a.status, 200, "{}", a.body);
        if a.body["rows"][0]["name"] == "after the partition" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still serving the pre-write row after {:?}: {}",
            started.elapsed(),
            a.body
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "FIGURES a deferral whose sidecar died applied by another after {:?}",
        started.elapsed()
    );
    // And nothing is left waiting.
    let left: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM ferry.deferred", &[])
        .expect("count")
        .get(0);
    assert_eq!(left, 0, "applied deferrals are removed");
}

//! A read never joins a fill that began before a write it follows, whichever sidecar took the
//! write (and so whichever invalidated): a fill is joined only by reads whose lookup saw the
//! versions its own lookup saw. Found by an attacker's review: flights were forgotten only by
//! writes through their own sidecar, so a read on sidecar S after a write acknowledged by
//! sidecar A joined S's fill from before it and returned the pre-write row. Two sidecar
//! binaries, one Redis, one Postgres; the rows Postgres returned judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn a_read_after_a_write_through_another_sidecar_never_joins_a_fill_from_before_it() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let a = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    // Slow enough that the write and the second read both happen while the first runs.
    let read = json!({
        "sql": "SELECT name, pg_sleep(1.5)::text AS slept FROM items WHERE id = 5",
        "cache": {"ttl_s": 60, "tables": ["items"]}
    });
    let (first, second) = s.client.block_on(async {
        let first = s.client.query_async(read.clone());
        let later = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let write = json!({
                "sql": "UPDATE items SET name = 'renamed 5' WHERE id = 5",
                "invalidate": {"tables": ["items"]}
            });
            let w = a.client.post("/v1/execute", &write).await;
            assert_eq!(w.status, 200, "{}", w.body);
            assert_eq!(w.body["invalidation"], "done", "{}", w.body);
            // After the write was acknowledged, on the sidecar whose fill began before it.
            s.client.query_async(read.clone()).await
        };
        futures::future::join(first, later).await
    });
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["rows"][0]["name"], "item 5", "{}", first.body);
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(
        second.body["rows"][0]["name"], "renamed 5",
        "a read after an acknowledged write returned the row from before it: {}",
        second.body
    );
}

//! A cached read that carries a write's position never returns rows from before that write,
//! even when the write named no invalidation and the change stream has not delivered it yet.
//! The stream is held back by freezing Postgres's WAL sender (SIGSTOP): within
//! `changes.max_lag_ms` plain cached reads may still see the old row (the documented bound),
//! but the read with the position skips the cache until the stream's watermark passes it.
mod change_stream_common;
use change_stream_common as common;
use ferry_testkit::RedisServer;
use serde_json::{json, Value};
use std::time::Duration;

fn qty(s: &ferry_testkit::SidecarProcess, after: Option<&Value>) -> (i64, String) {
    let mut body = json!({"sql": "SELECT qty FROM orders WHERE id = 1",
                          "cache": {"ttl_s": 600, "tables": ["orders"]}});
    if let Some(a) = after {
        body["after"] = a.clone();
    }
    let a = s.client.query(body);
    assert_eq!(a.status, 200, "{:?}", a.body);
    (
        a.body["rows"][0]["qty"].as_i64().expect("qty"),
        a.body["cache"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn a_read_with_a_position_skips_entries_the_stream_has_not_invalidated_yet() {
    let redis = RedisServer::start();
    let pg = common::logical_pg();
    let s = common::spawn_with(&redis, &pg, &[("FERRY_CHANGES_MAX_LAG_MS", "10000")]);
    common::wait_caught_up(&s);
    assert_eq!(qty(&s, None).0, 5);
    assert_eq!(qty(&s, None), (5, "hit".into()));

    let sender: i32 = pg
        .client()
        .query_one("SELECT pid FROM pg_stat_replication LIMIT 1", &[])
        .expect("the stream's WAL sender")
        .get(0);
    ferry_testkit::signal(sender as u32, "STOP");
    let w = s
        .client
        .execute(json!({"sql": "UPDATE orders SET qty = 6 WHERE id = 1"}));
    assert_eq!(w.status, 200, "{:?}", w.body);
    let position = w.body["position"].clone();
    assert!(position.is_string(), "{:?}", w.body);

    // Without the position: the entry, as the stream has not delivered the write (the bound).
    assert_eq!(qty(&s, None), (5, "hit".into()));
    // With it: never the row from before the write.
    for _ in 0..5 {
        assert_eq!(qty(&s, Some(&position)), (6, "bypass".into()));
    }
    ferry_testkit::signal(sender as u32, "CONT");
    ferry_testkit::wait_until(
        "the stream to deliver the write",
        Duration::from_secs(15),
        || qty(&s, None).0 == 6,
    );
    // Once the watermark has passed it, the position is served from the cache again.
    ferry_testkit::wait_until("a hit with the position", Duration::from_secs(15), || {
        qty(&s, Some(&position)) == (6, "hit".into())
    });
}

/// A second sidecar: the write's position comes from one, the read carrying it goes to the
/// other, which does not lead the stream and learns the watermark's position from Redis only.
/// It must skip the cache while the stream is held back, and hit again once it has passed.
#[test]
fn a_position_from_one_sidecar_is_honoured_by_another() {
    let redis = RedisServer::start();
    let pg = common::logical_pg();
    let env = [("FERRY_CHANGES_MAX_LAG_MS", "10000")];
    let leader = common::spawn_with(&redis, &pg, &env);
    common::wait_caught_up(&leader);
    let other = common::spawn_with(&redis, &pg, &env);
    common::wait_caught_up(&other);
    ferry_testkit::wait_until(
        "the second sidecar to follow",
        Duration::from_secs(10),
        || common::changes(&other)["role"] == "follower",
    );
    assert_eq!(qty(&other, None).0, 5);
    assert_eq!(qty(&other, None), (5, "hit".into()));

    let sender: i32 = pg
        .client()
        .query_one("SELECT pid FROM pg_stat_replication LIMIT 1", &[])
        .expect("the stream's WAL sender")
        .get(0);
    ferry_testkit::signal(sender as u32, "STOP");
    let w = leader
        .client
        .execute(json!({"sql": "UPDATE orders SET qty = 7 WHERE id = 1"}));
    assert_eq!(w.status, 200, "{:?}", w.body);
    let position = w.body["position"].clone();
    assert_eq!(
        qty(&other, None),
        (5, "hit".into()),
        "the stream is held back"
    );
    assert_eq!(qty(&other, Some(&position)), (7, "bypass".into()));
    ferry_testkit::signal(sender as u32, "CONT");
    ferry_testkit::wait_until(
        "the other sidecar to hit with the position",
        Duration::from_secs(15),
        || qty(&other, Some(&position)) == (7, "hit".into()),
    );
}

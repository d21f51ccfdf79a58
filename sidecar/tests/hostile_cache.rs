//! The hostile caller against cache identity, on the binary: an entry and a single-flight
//! query belong to (key, statement, parameters, tags), and no eviction can revive an
//! invalidated entry. Postgres's rows judge what is fresh.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn start(env: &[(&str, &str)]) -> (RedisServer, PgServer, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    // The sample config, for its named queries and keyspaces.
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let mut all = vec![
        ("FERRY_AUTH_ALLOW_RAW_SQL", "true"),
        ("FERRY_CONFIG", sample),
    ];
    all.extend_from_slice(env);
    let sidecar = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &all, Stdio::null());
    (redis, pg, sidecar)
}

fn name_of(a: &ferry_testkit::client::Answer) -> String {
    assert_eq!(a.status, 200, "{:?}", a.body);
    a.body["rows"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_key_never_carries_another_statements_rows() {
    let (_redis, _pg, s) = start(&[]);
    let c = &s.client;
    let read = |id: i32, key: &str| {
        c.query(json!({
            "sql": "SELECT id, name FROM items WHERE id = $1",
            "params": [id],
            "cache": {"ttl_s": 300, "key": key}
        }))
    };
    // The attacker fills "row:4" with row 3.
    assert_eq!(name_of(&read(3, "row:4")), "item 3");
    // An honest read of row 4 under that key gets row 4, stored apart; both stay cached.
    let honest = read(4, "row:4");
    assert_eq!(name_of(&honest), "item 4");
    assert_eq!(honest.body["cache"], "miss");
    assert_eq!(name_of(&read(4, "row:4")), "item 4");
    assert_eq!(read(4, "row:4").body["cache"], "hit");
    assert_eq!(name_of(&read(3, "row:4")), "item 3");

    // Through named queries (no raw SQL at all): the item query under the keyed batch's key.
    let named = c.query(json!({"query": "item", "params": [3], "cache": {"key": "items:4"}}));
    assert_eq!(name_of(&named), "item 3");
    let keyed = c.block_on(c.post("/v1/batch/keyed", &json!({"keyspace": "items", "ids": [4]})));
    assert_eq!(keyed.status, 200, "{:?}", keyed.body);
    assert_eq!(keyed.body["results"][0]["row"]["name"], "item 4");
    // And the other way round: the keyed entry does not answer the named query for row 3.
    let again = c.query(json!({"query": "item", "params": [3], "cache": {"key": "items:4"}}));
    assert_eq!(name_of(&again), "item 3");

    // One invalidation of the key drops every statement's entry under it.
    let w = c.execute(json!({
        "sql": "UPDATE items SET name = 'four' WHERE id = 4",
        "invalidate": {"keys": ["row:4"]}
    }));
    assert_eq!(w.status, 200, "{:?}", w.body);
    assert_eq!(name_of(&read(4, "row:4")), "four");
    assert_eq!(read(3, "row:4").body["cache"], "miss");
}

#[test]
fn single_flight_is_never_shared_across_tag_sets() {
    let (_redis, _pg, s) = start(&[]);
    let c = &s.client;
    let sql = "SELECT name, pg_sleep(1.5)::text AS slept FROM items WHERE id = 5";
    let (untagged, tagged) = c.block_on(async {
        // A reader without tags starts a slow miss under key "five".
        let first = c.query_async(json!({"sql": sql, "cache": {"ttl_s": 300, "key": "five"}}));
        let later = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            // A write commits and invalidates the tag only.
            let w = c
                .post(
                    "/v1/execute",
                    &json!({
                        "sql": "UPDATE items SET name = 'five after' WHERE id = 5",
                        "invalidate": {"tags": ["items5"]}
                    }),
                )
                .await;
            assert_eq!(w.status, 200, "{:?}", w.body);
            assert_eq!(w.body["invalidation"], "done");
            // A reader naming that tag, after the write was acknowledged, must not join the
            // flight that began before it.
            c.query_async(
                json!({"sql": sql, "cache": {"ttl_s": 300, "key": "five", "tags": ["items5"]}}),
            )
            .await
        };
        futures::future::join(first, later).await
    });
    assert_eq!(name_of(&untagged), "item 5", "began before the write");
    assert_eq!(
        name_of(&tagged),
        "five after",
        "read after the write names the tag"
    );
}

#[test]
fn an_evicted_version_never_lets_an_old_read_write_back() {
    let (redis, _pg, s) = start(&[]);
    let c = &s.client;
    let sql = "SELECT name, pg_sleep(1.5)::text AS slept FROM items WHERE id = 6";
    let read = || json!({"sql": sql, "cache": {"ttl_s": 300, "key": "six", "tags": ["t6"]}});
    let slow = c.block_on(async {
        let slow = c.query_async(read());
        let writer = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let w = c
                .post(
                    "/v1/execute",
                    &json!({
                        "sql": "UPDATE items SET name = 'six after' WHERE id = 6",
                        "invalidate": {"keys": ["six"], "tags": ["t6"]}
                    }),
                )
                .await;
            assert_eq!(w.body["invalidation"], "done", "{:?}", w.body);
            // Redis evicts the versions the invalidation just wrote (as maxmemory would).
            let mut r = redis.conn();
            let _: () = ::redis::cmd("DEL")
                .arg("ferry:v:six")
                .arg("ferry:t:t6")
                .query(&mut r)
                .expect("evict");
        };
        futures::future::join(slow, writer).await.0
    });
    assert_eq!(
        name_of(&slow),
        "item 6",
        "the slow read began before the write"
    );
    // The slow read's write-back must have been refused: the next read is fresh.
    let next = c.query(read());
    assert_eq!(name_of(&next), "six after", "{:?}", next.body);
}

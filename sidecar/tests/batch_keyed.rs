//! Keyed batch: one Redis MGET, the misses filled by ONE Postgres query, written back, answered
//! in request order with hit / miss / not_found per id.
use ferry_sidecar::config::Keyspace;
use ferry_testkit as common;
use serde_json::json;

/// A keyspace whose statement counts its executions (the CTE runs once per statement).
fn counted(c: &mut ferry_sidecar::Config) {
    c.keyspaces.insert(
        "counted".into(),
        Keyspace {
            sql: "WITH bump AS (SELECT ferry_test_touch()) \
                  SELECT id, name, price FROM items, bump WHERE id = ANY($1)"
                .into(),
            key_column: "id".into(),
            ttl_s: 300,
            tags: vec!["items".into()],
            table: None,
        },
    );
}

fn keyed(c: &common::Client, ids: serde_json::Value) -> common::client::Answer {
    c.block_on(c.post(
        "/v1/batch/keyed",
        &json!({"keyspace": "counted", "ids": ids}),
    ))
}

#[test]
fn partial_hits_and_one_query_for_the_misses() {
    let stack = common::Stack::start_with(counted);
    let c = &stack.client;
    let ids: Vec<i64> = (1..=100).collect();
    let r = keyed(c, json!(ids));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let results = r.body["results"].as_array().expect("results");
    assert_eq!(results.len(), 100);
    assert!(results.iter().all(|x| x["status"] == "miss"));
    assert_eq!(stack.pg.reads(), 1, "100 misses, one Postgres query");

    // 50 cached, 50 not, one unknown, one duplicate, out of order.
    let mut ids: Vec<i64> = (51..=150).rev().collect();
    ids.push(5000);
    ids.push(60);
    let r = keyed(c, json!(ids));
    let results = r.body["results"].as_array().expect("results");
    assert_eq!(results.len(), ids.len());
    for (x, id) in results.iter().zip(&ids) {
        assert_eq!(x["id"], *id, "request order");
        let want = match id {
            51..=100 => "hit",
            101..=150 => "miss",
            _ => "not_found",
        };
        assert_eq!(x["status"], want, "id {id}: {x:?}");
        if want == "not_found" {
            assert!(x["row"].is_null());
        } else {
            assert_eq!(x["row"]["name"], format!("item {id}"));
        }
    }
    assert_eq!(stack.pg.reads(), 2, "50 misses, one more query");
    // All cached now, as counted:<id> entries.
    let r = keyed(c, json!([101, 150, 51]));
    assert!(r.body["results"]
        .as_array()
        .expect("r")
        .iter()
        .all(|x| x["status"] == "hit"));
    assert_eq!(stack.pg.reads(), 2);
    let single = c.query(
        json!({"sql": "SELECT 0", "cache": {"ttl_s": 5, "key": "counted:150", "tags": ["items"]}}),
    );
    // Another statement under a keyed entry's name is stored apart: never served its rows.
    assert_eq!(single.body["cache"], "miss", "{:?}", single.body);
    assert!(
        single.body["rows"][0]["name"].is_null(),
        "{:?}",
        single.body
    );
}

#[test]
fn writes_invalidate_keyed_rows_by_key_and_by_tag() {
    let stack = common::Stack::start_with(counted);
    let c = &stack.client;
    keyed(c, json!([1, 2, 3]));
    c.execute(json!({"sql": "UPDATE items SET name = 'one' WHERE id = 1", "invalidate": {"keys": ["counted:1"]}}));
    let r = keyed(c, json!([1, 2]));
    assert_eq!(r.body["results"][0]["status"], "miss");
    assert_eq!(r.body["results"][0]["row"]["name"], "one");
    assert_eq!(r.body["results"][1]["status"], "hit");
    c.execute(json!({"sql": "UPDATE items SET name = 'two' WHERE id = 2", "invalidate": {"tags": ["items"]}}));
    let r = keyed(c, json!([2, 3]));
    assert_eq!(r.body["results"][0]["row"]["name"], "two");
    assert!(r.body["results"]
        .as_array()
        .expect("r")
        .iter()
        .all(|x| x["status"] == "miss"));
}

#[test]
fn redis_down_serves_every_row_from_postgres() {
    let mut stack = common::Stack::start_with(counted);
    stack.redis.kill();
    let r = keyed(&stack.client, json!([1, 2, 9999]));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let s: Vec<_> = r.body["results"]
        .as_array()
        .expect("r")
        .iter()
        .map(|x| x["status"].clone())
        .collect();
    assert_eq!(
        s,
        vec![json!("bypass"), json!("bypass"), json!("not_found")]
    );
}

#[test]
fn keyed_mistakes_are_4xx() {
    let stack = common::Stack::start_with(|c| {
        counted(c);
        c.cache.max_batch = 10;
    });
    let c = &stack.client;
    for (body, field) in [
        (json!({"keyspace": "nope", "ids": [1]}), "keyspace"),
        (json!({"keyspace": "counted", "ids": []}), "ids"),
        (
            json!({"keyspace": "counted", "ids": (0..11).collect::<Vec<_>>()}),
            "ids",
        ),
        (
            json!({"keyspace": "counted", "ids": [1, {"a": 1}]}),
            "ids[1]",
        ),
    ] {
        let r = c.block_on(c.post("/v1/batch/keyed", &body));
        assert_eq!(r.status, 400, "{body}: {:?}", r.body);
        assert_eq!(r.body["error"]["field"], field, "{body}");
    }
}

/// Another spelling of an id ("07", " 7") is not row 7: Postgres would find row 7 for it, but
/// the invalidations of row 7 name `counted:7`, never `counted:07`, so such an entry would
/// never be dropped. Not found, alone or among others, and row 7 itself is unaffected.
#[test]
fn another_spelling_of_an_id_is_not_found() {
    let stack = common::Stack::start_with(counted);
    let c = &stack.client;
    let statuses = |ids: serde_json::Value| -> Vec<serde_json::Value> {
        let r = keyed(c, ids);
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|x| {
                assert!(x["status"] != "not_found" || x["row"].is_null(), "{x:?}");
                x["status"].clone()
            })
            .collect()
    };
    assert_eq!(statuses(json!(["07"])), vec![json!("not_found")]);
    assert_eq!(
        statuses(json!(["07", " 7", 8])),
        vec![json!("not_found"), json!("not_found"), json!("miss")]
    );
    assert_eq!(
        statuses(json!([7, "7"])),
        vec![json!("miss"), json!("miss")]
    );
}

/// A keyed read whose grouped statement fails fails whole, at once: its ids are not run one by
/// one (49 good ids and one Postgres cannot take cost 49 statements before, then failed anyway).
#[test]
fn a_failed_keyed_read_is_not_run_id_by_id() {
    let stack = common::Stack::start_with(counted);
    let c = &stack.client;
    let mut ids: Vec<serde_json::Value> = (1..=49).map(|i| json!(i)).collect();
    ids.push(json!("abc"));
    let before = stack.pg.reads();
    let r = keyed(c, json!(ids));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(stack.pg.reads(), before, "no statement ran id by id");
}

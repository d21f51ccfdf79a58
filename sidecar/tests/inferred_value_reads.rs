//! Inferred value reads: a read of one table by an equality on an indexed column
//! (`WHERE post_id = $1`) depends on the rows holding that value, old or new. A write that
//! brings every value it touches (an INSERT; any write under REPLICA IDENTITY FULL) leaves the
//! other values' entries hits; one whose old values the stream does not send (an UPDATE or a
//! DELETE under the default identity) drops every value read of the table. Against the binary
//! and a private logical Postgres; Postgres's rows judge what is fresh.
mod change_stream_common;
mod inferred_common;

use change_stream_common::{after_bound, wait_caught_up};
use ferry_testkit::SidecarProcess;
use inferred_common::*;
use serde_json::{json, Value};
use std::time::Instant;

const OF_POST: &str = "SELECT id, body FROM comments WHERE post_id = $1 ORDER BY id";

/// The bodies of post `id`'s comments, the cache status and the entry's key.
fn comments(s: &SidecarProcess, id: i64) -> (Vec<String>, String, String) {
    let a = read(s, OF_POST, json!([id]));
    let bodies = a.body["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["body"].as_str().unwrap_or_default().to_string())
        .collect();
    let field = |f: &str| a.body[f].as_str().unwrap_or_default().to_string();
    (bodies, field("cache"), field("key"))
}

/// Post `id`'s comments read until a hit, each answer checked against `expect`.
fn warm(s: &SidecarProcess, id: i64, expect: &[&str]) {
    until_hit(s, OF_POST, json!([id]), |rows: &Value| {
        let bodies: Vec<&str> = rows
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|r| r["body"].as_str())
            .collect();
        assert_eq!(bodies, expect, "a stale read of post comments");
    });
}

fn settle() {
    after_bound(Instant::now());
}

#[test]
fn a_read_by_an_indexed_value_depends_on_the_rows_of_that_value() {
    let (redis, pg, s) = stack();
    let mut psql = pg.client();
    warm(&s, 1, &["c1", "c2"]);
    warm(&s, 2, &["c3"]);
    let key = comments(&s, 1).2;
    assert!(key.starts_with("~val:"), "not a value read: {key}");
    // A column without an index: the read depends on the table.
    let by_body = "SELECT id FROM comments WHERE body = $1";
    until_hit(&s, by_body, json!(["c3"]), |rows| {
        assert_eq!(rows[0]["id"], 3)
    });
    let a = read(&s, by_body, json!(["c3"]));
    assert!(!a.body["key"]
        .as_str()
        .unwrap_or_default()
        .starts_with("~val:"));

    // An INSERT for post 2: post 1's entry stays, post 2's goes; the unindexed read goes.
    psql.execute("INSERT INTO comments VALUES (4, 2, 'c4')", &[])
        .expect("insert");
    settle();
    wait_caught_up(&s);
    assert_eq!(
        comments(&s, 1).1,
        "hit",
        "an insert for post 2 dropped post 1"
    );
    assert_eq!(comments(&s, 2).0, ["c3", "c4"]);
    psql.execute("INSERT INTO comments VALUES (5, 3, 'c3')", &[])
        .expect("insert a body");
    settle();
    // The stream moved a key per value (bodies, ids) but made none for values no read
    // was named by: nothing left in Redis per changed value.
    let versions: Vec<String> = redis::cmd("KEYS")
        .arg("*v:~val:public.comments.body:*")
        .query(&mut redis.conn())
        .expect("keys");
    assert!(versions.is_empty(), "versions left per value: {versions:?}");
    assert_eq!(
        read(&s, by_body, json!(["c3"])).body["rows"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    // Default identity: an UPDATE's old values are not sent. A body edited in place, and a
    // comment moved from post 1 to post 2: both posts read fresh.
    warm(&s, 1, &["c1", "c2"]);
    psql.execute("UPDATE comments SET body = 'c1!' WHERE id = 1", &[])
        .expect("edit");
    settle();
    assert_eq!(comments(&s, 1).0, ["c1!", "c2"]);
    warm(&s, 2, &["c3", "c4"]);
    psql.execute("UPDATE comments SET post_id = 2 WHERE id = 2", &[])
        .expect("move");
    settle();
    assert_eq!(comments(&s, 1).0, ["c1!"]);
    assert_eq!(comments(&s, 2).0, ["c2", "c3", "c4"]);
    // A DELETE sends the key alone.
    warm(&s, 1, &["c1!"]);
    psql.execute("DELETE FROM comments WHERE id = 1", &[])
        .expect("delete");
    settle();
    assert!(comments(&s, 1).0.is_empty(), "a deleted comment was served");

    // REPLICA IDENTITY FULL: every old value comes; a write to post 2's comments (an edit, a
    // move to post 3) leaves post 1's entry a hit, and reads fresh for 2 and 3.
    psql.batch_execute(
        "ALTER TABLE comments REPLICA IDENTITY FULL; INSERT INTO comments VALUES (6, 1, 'c6');",
    )
    .expect("full");
    settle();
    warm(&s, 1, &["c6"]);
    warm(&s, 2, &["c2", "c3", "c4"]);
    warm(&s, 3, &["c3"]);
    psql.batch_execute(
        "UPDATE comments SET body = 'c3!' WHERE id = 3; UPDATE comments SET post_id = 3 WHERE id = 4;",
    )
    .expect("under full");
    settle();
    wait_caught_up(&s);
    assert_eq!(
        comments(&s, 1).1,
        "hit",
        "a write to post 2 under FULL dropped post 1"
    );
    assert_eq!(comments(&s, 2).0, ["c2", "c3!"]);
    assert_eq!(comments(&s, 3).0, ["c4", "c3"]);
    psql.execute("DELETE FROM comments WHERE id = 6", &[])
        .expect("delete under full");
    settle();
    assert!(comments(&s, 1).0.is_empty(), "a deleted comment was served");
}

/// What the stream does not send, or sends as other text than the request's, never names an
/// entry: a generated column (left out of the stream), a column left out of the publication's
/// column list, a parameter of another type than its column (`$1::name`, which Postgres cuts
/// to 63 bytes). Each such read depends on its table and is fresh after an INSERT. And an
/// enum's label renamed under every row (no row in the stream) reaches a cached read of it.
#[test]
fn what_the_stream_does_not_send_names_no_entry() {
    let (_redis, pg, s) = stack();
    let mut psql = pg.client();
    let long = "a".repeat(70);
    let reads = [
        ("SELECT id FROM gen WHERE g = $1", json!([20])),
        ("SELECT id FROM partial WHERE post_id = $1", json!([1])),
        ("SELECT id FROM slugs WHERE slug = $1::name", json!([long])),
    ];
    for (sql, params) in &reads {
        until_hit(&s, sql, params.clone(), |rows| {
            assert_eq!(rows.as_array().map(Vec::len), Some(1), "{sql}")
        });
        let key = read(&s, sql, params.clone()).body["key"].clone();
        assert!(
            !key.as_str().unwrap_or_default().starts_with("~val:"),
            "{sql}: named by a value the stream does not send: {key}"
        );
    }
    psql.batch_execute(
        "INSERT INTO gen (id, a) VALUES (2, 10); INSERT INTO partial VALUES (2, 1, 'p2');
         INSERT INTO slugs VALUES (2, repeat('a', 63));",
    )
    .expect("inserts");
    settle();
    for (sql, params) in &reads {
        let a = read(&s, sql, params.clone());
        assert_eq!(
            a.body["rows"].as_array().map(Vec::len),
            Some(2),
            "{sql}: stale {:?}",
            a.body
        );
    }

    let mood = "SELECT m FROM moods WHERE id = $1";
    until_hit(&s, mood, json!([1]), |rows| assert_eq!(rows[0]["m"], "sad"));
    psql.batch_execute("ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'")
        .expect("rename");
    settle();
    wait_caught_up(&s);
    let a = read(&s, mood, json!([1]));
    assert_eq!(
        a.body["rows"][0]["m"], "blue",
        "a renamed label was served: {:?}",
        a.body
    );
}

//! Writes run on Postgres, then invalidate the named entries before the answer: a read after
//! an acknowledged write returns the new value.
use ferry_testkit as common;
use serde_json::json;

fn read(c: &common::Client, id: i64) -> common::client::Answer {
    c.query(json!({
        "sql": "SELECT id, name FROM items WHERE id = $1",
        "params": [id],
        "cache": {"ttl_s": 300, "key": format!("item:{id}")}
    }))
}

#[test]
fn read_after_write_returns_the_new_value() {
    let stack = common::Stack::start();
    let c = &stack.client;
    assert_eq!(read(c, 9).body["cache"], "miss");
    assert_eq!(read(c, 9).body["rows"][0]["name"], "item 9");
    assert_eq!(read(c, 9).body["cache"], "hit");

    let w = c.execute(json!({
        "sql": "UPDATE items SET name = $1 WHERE id = $2",
        "params": ["renamed", 9],
        "invalidate": {"keys": ["item:9"]}
    }));
    assert_eq!(w.status, 200, "{:?}", w.body);
    assert_eq!(w.body, json!({"rows_affected": 1, "invalidation": "done"}));

    let after = read(c, 9);
    assert_eq!(after.body["cache"], "miss");
    assert_eq!(after.body["rows"][0]["name"], "renamed");
    assert_eq!(read(c, 9).body["cache"], "hit");
}

#[test]
fn hashed_entries_are_invalidated_by_the_key_a_read_returned() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let req = json!({"sql": "SELECT price FROM items WHERE id = $1", "params": [2], "cache": {"ttl_s": 300}});
    let first = c.query(req.clone());
    let key = first.body["key"].clone();
    assert_eq!(first.body["rows"][0]["price"], "2.50");
    let w = c.execute(json!({
        "sql": "UPDATE items SET price = price + 1 WHERE id = 2",
        "invalidate": {"keys": [key]}
    }));
    assert_eq!(w.body["invalidation"], "done");
    let after = c.query(req);
    assert_eq!(after.body["cache"], "miss");
    assert_eq!(after.body["rows"][0]["price"], "3.50");
}

#[test]
fn a_write_without_invalidation_says_so_and_counts_rows() {
    let stack = common::Stack::start();
    let w = stack.client.execute(json!({
        "sql": "DELETE FROM items WHERE id > $1",
        "params": [990]
    }));
    assert_eq!(w.body, json!({"rows_affected": 10, "invalidation": "none"}));
}

#[test]
fn a_failed_write_changes_nothing_and_invalidates_nothing() {
    let stack = common::Stack::start();
    let c = &stack.client;
    assert_eq!(read(c, 4).body["cache"], "miss");
    let w = c.execute(json!({
        "sql": "INSERT INTO items (id, name, price) VALUES ($1, $2, 1)",
        "params": [4, "duplicate"],
        "invalidate": {"keys": ["item:4"]}
    }));
    assert_eq!(w.status, 400, "{:?}", w.body);
    assert_eq!(w.code(), "sql_error");
    assert_eq!(w.body["error"]["pg_code"], "23505");
    assert_eq!(read(c, 4).body["cache"], "hit");
}

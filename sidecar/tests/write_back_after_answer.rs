//! A miss is answered as soon as Postgres has answered; its write-back (conditional, as ever,
//! on the versions seen before the query) follows the answer. Two adversaries:
//! - a write acknowledged right after the miss's answer, before its write-back lands: the late
//!   write-back must not put the pre-write rows back (the next read sees the write);
//! - a read right after the answer, on the same sidecar: it must not query Postgres again (it
//!   joins the fill, which stays joinable until Redis has the entry, or finds the entry), and
//!   it is a hit.
//!
//! Postgres's own count of executions and the rows it returns judge.
use ferry_testkit as common;
use serde_json::json;

const READ: &str = "SELECT id, name, ferry_test_touch() AS touched FROM items WHERE id = $1";

fn cached(id: i64) -> serde_json::Value {
    json!({"sql": READ, "params": [id], "cache": {"ttl_s": 60, "tables": ["items"]}})
}

#[test]
fn a_write_right_after_a_miss_is_never_undone_by_its_write_back() {
    let stack = common::Stack::start();
    let c = &stack.client;
    for id in 1..=150i64 {
        let first = c.query(cached(id));
        assert_eq!(first.status, 200, "{}", first.body);
        assert_eq!(first.body["cache"], "miss", "{}", first.body);
        let name = format!("renamed {id}");
        let w = c.execute(json!({
            "sql": "UPDATE items SET name = $1 WHERE id = $2",
            "params": [name, id], "invalidate": {"tables": ["items"]}
        }));
        assert_eq!(w.status, 200, "{}", w.body);
        let after = c.query(cached(id));
        assert_eq!(after.status, 200, "{}", after.body);
        assert_eq!(
            after.body["rows"][0]["name"], name,
            "read {id} after an acknowledged write returned the pre-write row: {}",
            after.body
        );
    }
}

#[test]
fn a_read_right_after_a_miss_does_not_query_postgres_again() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let n = 200i64;
    for id in 1..=n {
        let first = c.query(cached(id));
        assert_eq!(first.body["cache"], "miss", "{}", first.body);
        let again = c.query(cached(id));
        assert_eq!(again.status, 200, "{}", again.body);
        assert_eq!(
            again.body["cache"], "hit",
            "read {id} again: {}",
            again.body
        );
        assert_eq!(again.body["rows"], first.body["rows"]);
    }
    assert_eq!(
        stack.pg.reads(),
        n,
        "one Postgres execution per key: a read right after a miss queried again"
    );
}

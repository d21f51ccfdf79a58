//! When Postgres fails and a stale copy is within stale_if_error_s, it is served, marked stale
//! with the error; without it the error stands.
use ferry_testkit as common;
use serde_json::json;
use std::time::Duration;

#[test]
fn postgres_down_serves_the_stale_copy_with_the_error() {
    let mut stack = common::Stack::start();
    let c = &stack.client;
    let kept = json!({"sql": "SELECT name FROM items WHERE id = 2", "cache": {"ttl_s": 1, "stale_if_error_s": 60}});
    let not_kept = json!({"sql": "SELECT name FROM items WHERE id = 3", "cache": {"ttl_s": 1}});
    assert_eq!(c.query(kept.clone()).body["cache"], "miss");
    assert_eq!(c.query(not_kept.clone()).body["cache"], "miss");
    std::thread::sleep(Duration::from_millis(1200));

    stack.pg.stop();
    let r = c.query(kept.clone());
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["cache"], "stale");
    assert_eq!(r.body["stale_reason"], "error");
    assert_eq!(r.body["upstream_error"], "database_unavailable");
    assert_eq!(r.body["rows"][0]["name"], "item 2");

    let r = c.query(not_kept);
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.code(), "database_unavailable");

    // Back up: a fresh read replaces the stale copy.
    stack.pg.start_again();
    common::wait_until("postgres to serve again", Duration::from_secs(10), || {
        c.query(kept.clone()).body["cache"] == "miss"
    });
}

#[test]
fn the_callers_own_errors_are_never_papered_over() {
    let stack = common::Stack::start();
    let c = &stack.client;
    // Same key, a statement that now fails with a SQL error: the error is returned.
    let good = json!({"sql": "SELECT 1 AS one", "cache": {"ttl_s": 1, "stale_if_error_s": 60, "key": "k1"}});
    let bad = json!({"sql": "SELECT 1/0 AS one", "cache": {"ttl_s": 1, "stale_if_error_s": 60, "key": "k1"}});
    c.query(good);
    std::thread::sleep(Duration::from_millis(1200));
    let r = c.query(bad);
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["error"]["pg_code"], "22012");
}

#[test]
fn an_invalidated_entry_is_not_a_stale_copy() {
    let mut stack = common::Stack::start();
    let c = &stack.client;
    let req = json!({"sql": "SELECT name FROM items WHERE id = 4", "cache": {"ttl_s": 1, "stale_if_error_s": 60, "key": "item-4"}});
    c.query(req.clone());
    let w = c.execute(json!({"sql": "UPDATE items SET name = 'new' WHERE id = 4", "invalidate": {"keys": ["item-4"]}}));
    assert_eq!(w.body["invalidation"], "done");
    stack.pg.stop();
    let r = c.query(req);
    assert_eq!(
        r.status, 503,
        "the pre-write copy must not come back: {:?}",
        r.body
    );
}

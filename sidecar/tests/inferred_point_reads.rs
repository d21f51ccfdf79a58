//! Inferred point reads: a read of one row by its table's one-column primary key depends on
//! that row alone (`store/postgres/point_read.rs`), and what only looks like one (a self-join,
//! a subquery, a case-insensitive key, a replica identity changed underneath) on its table.
//! Against the binary and a private logical Postgres; Postgres's rows judge what is fresh.
mod change_stream_common;
mod inferred_common;

use change_stream_common::{after_bound, wait_caught_up};
use ferry_testkit::wait_until;
use inferred_common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A point read by the table's key depends on its row: a write to another row leaves it a hit,
/// a write to its row (its key changed, too) is seen. A read that also reads another row (a
/// self-join) depends on the whole table.
#[test]
fn a_point_read_by_key_depends_on_its_row_alone() {
    let (_redis, pg, s) = stack();
    let mut psql = pg.client();
    let by_id = "SELECT title FROM posts WHERE id = $1";
    let title = |id: i64| {
        let a = read(&s, by_id, json!([id]));
        (
            a.body["rows"][0]["title"]
                .as_str()
                .unwrap_or("<none>")
                .to_string(),
            a.body["cache"].as_str().unwrap_or_default().to_string(),
            a.body["key"].as_str().unwrap_or_default().to_string(),
        )
    };
    for id in [1, 2, 3, 30] {
        wait_until("a hit", Duration::from_secs(10), || title(id).1 == "hit");
    }
    assert_eq!(title(1).2, "~row:public.posts:1");
    let pair = "SELECT b.title FROM posts a JOIN posts b ON b.id = a.id + 1 WHERE a.id = $1";
    until_hit(&s, pair, json!([1]), |rows| {
        assert_eq!(rows[0]["title"], "second")
    });

    psql.execute(
        "UPDATE posts SET title = 'second, edited' WHERE id = 2",
        &[],
    )
    .expect("update 2");
    after_bound(Instant::now());
    wait_caught_up(&s);
    assert_eq!(title(2).0, "second, edited");
    assert_eq!(title(1).1, "hit", "another row's write left row 1's entry");
    // The self-join read row 2 too: it depends on the table.
    let a = read(&s, pair, json!([1]));
    assert_eq!(a.body["rows"][0]["title"], "second, edited", "{:?}", a.body);

    // A key changed: the old row's entry and the new row's (cached as no row) both go.
    psql.execute("UPDATE posts SET id = 30 WHERE id = 3", &[])
        .expect("move 3");
    after_bound(Instant::now());
    assert_eq!(title(3).0, "<none>");
    assert_eq!(title(30).0, "third");
    psql.execute("DELETE FROM posts WHERE id = 30", &[])
        .expect("delete");
    after_bound(Instant::now());
    assert_eq!(title(30).0, "<none>");
}

/// What only looks like a point read is kept fresh by its table: a key compared through a
/// subquery (its output is printed `$n` in the plan, as a parameter is), a key under a
/// case-insensitive collation (`'ALICE'` finds `alice`); and a table whose replica identity
/// changed under a cached point read (the stream keys rows by the identity) drops it.
#[test]
fn what_only_looks_like_a_point_read_stays_fresh() {
    let (_redis, pg, s) = stack();
    let mut psql = pg.client();
    let key_of = |sql: &str, params: Value| {
        let a = read(&s, sql, params);
        a.body["key"].as_str().unwrap_or_default().to_string()
    };
    // The subquery's `$1` is the request's $2 (row 2), not $1.
    let sub =
        "SELECT title, $1::int AS decoy FROM posts WHERE (SELECT true) AND id = (SELECT $2::int)";
    until_hit(&s, sub, json!([1, 2]), |rows| {
        assert_eq!(rows[0]["title"], "second")
    });
    assert!(!key_of(sub, json!([1, 2])).starts_with("~row:"));
    let ci = "SELECT v FROM users WHERE name = $1";
    until_hit(&s, ci, json!(["ALICE"]), |rows| assert_eq!(rows[0]["v"], 1));
    assert!(!key_of(ci, json!(["ALICE"])).starts_with("~row:"));
    psql.batch_execute(
        "UPDATE posts SET title = 'two' WHERE id = 2; UPDATE users SET v = 2 WHERE name = 'alice';",
    )
    .expect("updates");
    after_bound(Instant::now());
    assert_eq!(read(&s, sub, json!([1, 2])).body["rows"][0]["title"], "two");
    assert_eq!(read(&s, ci, json!(["ALICE"])).body["rows"][0]["v"], 2);

    // The stream last saw posts with REPLICA IDENTITY FULL; back to the key, a point read is
    // cached by its row; then FULL again and a write to that row, which the stream cannot key.
    psql.batch_execute(
        "ALTER TABLE posts REPLICA IDENTITY FULL; UPDATE posts SET title = 'third!' WHERE id = 3;
         ALTER TABLE posts REPLICA IDENTITY DEFAULT;",
    )
    .expect("full, then default");
    let by_id = "SELECT title FROM posts WHERE id = $1";
    wait_until("a point read by row", Duration::from_secs(10), || {
        let a = read(&s, by_id, json!([1]));
        a.body["cache"] == "hit" && a.body["key"] == "~row:public.posts:1"
    });
    // FULL again, a write to row 1 (its key not sent: the stream cannot key it), and back to
    // the key: the point read by row 1 is made again, and must not find the old entry.
    psql.batch_execute("ALTER TABLE posts REPLICA IDENTITY FULL")
        .expect("full");
    psql.execute("UPDATE posts SET title = 'one, edited' WHERE id = 1", &[])
        .expect("a write under FULL");
    after_bound(Instant::now());
    wait_caught_up(&s);
    psql.batch_execute("ALTER TABLE posts REPLICA IDENTITY DEFAULT")
        .expect("default");
    wait_until("a point read by row again", Duration::from_secs(10), || {
        let a = read(&s, by_id, json!([1]));
        assert_eq!(a.body["rows"][0]["title"], "one, edited", "{:?}", a.body);
        a.body["key"] == "~row:public.posts:1"
    });
}

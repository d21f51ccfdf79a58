//! Inferred point reads: a read of one row by its table's primary key depends on that row alone
//! (`store/postgres/by_value.rs`), and what only looks like one (a self-join,
//! a subquery, a case-insensitive key) on its table; under a replica identity without the key,
//! a write's old key is not sent, and every read by key goes.
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
    assert_eq!(title(1).2, "~val:public.posts.id:1");
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
    assert!(!key_of(sub, json!([1, 2])).starts_with("~val:"));
    let ci = "SELECT v FROM users WHERE name = $1";
    until_hit(&s, ci, json!(["ALICE"]), |rows| assert_eq!(rows[0]["v"], 1));
    assert!(!key_of(ci, json!(["ALICE"])).starts_with("~val:"));
    psql.batch_execute(
        "UPDATE posts SET title = 'two' WHERE id = 2; UPDATE users SET v = 2 WHERE name = 'alice';",
    )
    .expect("updates");
    after_bound(Instant::now());
    assert_eq!(read(&s, sub, json!([1, 2])).body["rows"][0]["title"], "two");
    assert_eq!(read(&s, ci, json!(["ALICE"])).body["rows"][0]["v"], 2);

    // A replica identity without the key (USING INDEX on another unique column): a write
    // that moves row 1 to id 40 sends no old id, so every read by id goes; the read by row 1
    // must not find row 1's entry.
    psql.batch_execute(
        "CREATE UNIQUE INDEX posts_title ON posts (title);
         ALTER TABLE posts REPLICA IDENTITY USING INDEX posts_title;
         UPDATE posts SET title = title WHERE id = 2;",
    )
    .expect("identity on the title");
    // (The write makes the stream describe the table again: a redefinition drops it whole.)
    after_bound(Instant::now());
    wait_caught_up(&s);
    let by_id = "SELECT title FROM posts WHERE id = $1";
    wait_until("a read by row 1", Duration::from_secs(10), || {
        let a = read(&s, by_id, json!([1]));
        assert_eq!(a.body["rows"][0]["title"], "first", "{:?}", a.body);
        a.body["cache"] == "hit" && a.body["key"] == "~val:public.posts.id:1"
    });
    psql.execute("UPDATE posts SET id = 40 WHERE id = 1", &[])
        .expect("move row 1");
    after_bound(Instant::now());
    let a = read(&s, by_id, json!([1]));
    assert_eq!(
        a.body["rows"],
        json!([]),
        "a moved row was served: {:?}",
        a.body
    );
    assert_eq!(
        read(&s, by_id, json!([40])).body["rows"][0]["title"],
        "first"
    );
}

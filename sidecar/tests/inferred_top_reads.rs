//! Inferred top-N reads: `SELECT id, title FROM posts ORDER BY id DESC LIMIT 3` depends on the
//! rows it returned, on a new row and on a change of a row's `id`, not on the rest of the
//! table. A psql write to another post leaves it a hit; an edit of a returned post, a new
//! post, a deleted one and a post whose id moved to the top read fresh. What only looks like
//! one (an OFFSET, which the plan does not print, in the statement or in a view; a filter on
//! another column; no ORDER BY; an index of a case-insensitive collation) depends on its
//! table. Against the binary and a private logical Postgres; Postgres's rows judge.
mod change_stream_common;
mod inferred_common;

use ferry_testkit::SidecarProcess;
use inferred_common::*;
use serde_json::{json, Value};

const TOP: &str = "SELECT id, title FROM posts ORDER BY id DESC LIMIT 3";
const SKIP: &str = "SELECT id, title FROM posts ORDER BY id DESC LIMIT 2 OFFSET 1";
const ADA: &str = "SELECT id, title FROM posts WHERE author_id = 1 ORDER BY id DESC LIMIT 2";

/// (id, title) pairs of `rows`.
fn pairs(rows: &Value) -> Vec<(i64, String)> {
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            let title = r["title"].as_str().unwrap_or_default().to_string();
            (r["id"].as_i64().unwrap_or_default(), title)
        })
        .collect()
}

/// What Postgres answers to `sql` now: the judge.
fn truth(pg: &ferry_testkit::PgServer, sql: &str) -> Vec<(i64, String)> {
    pg.client()
        .query(sql, &[])
        .expect("truth")
        .iter()
        .map(|r| (i64::from(r.get::<_, i32>(0)), r.get(1)))
        .collect()
}

/// `sql` read until a hit, each answer checked against Postgres.
fn warm(s: &SidecarProcess, pg: &ferry_testkit::PgServer, sql: &str) {
    let want = truth(pg, sql);
    until_hit(s, sql, json!([]), |rows| {
        assert_eq!(pairs(rows), want, "a stale read of {sql}")
    });
}

/// `sql` now through Ferry: (rows, cache status, key).
fn now(s: &SidecarProcess, sql: &str) -> (Vec<(i64, String)>, String, String) {
    let a = read(s, sql, json!([]));
    let field = |f: &str| a.body[f].as_str().unwrap_or_default().to_string();
    (pairs(&a.body["rows"]), field("cache"), field("key"))
}

#[test]
fn a_top_n_read_depends_on_its_rows_a_new_row_and_its_order() {
    let (_redis, pg, s) = stack();
    let mut psql = pg.client();
    psql.batch_execute(
        "INSERT INTO posts SELECT i, 1 + i % 2, 'post ' || i FROM generate_series(4, 20) i",
    )
    .expect("posts");
    settle(&s);
    warm(&s, &pg, TOP);

    // Another post edited, another deleted: still a hit.
    psql.batch_execute(
        "UPDATE posts SET title = 'edited' WHERE id = 5; DELETE FROM posts WHERE id = 3;",
    )
    .expect("elsewhere");
    settle(&s);
    let (rows, cache, _) = now(&s, TOP);
    assert_eq!(
        cache, "hit",
        "a write to another post dropped the top posts"
    );
    assert_eq!(rows, truth(&pg, TOP));

    // Each change that reaches the top: the read is fresh after it.
    for write in [
        "UPDATE posts SET title = 'edited' WHERE id = 19",
        "INSERT INTO posts VALUES (21, 1, 'new')",
        "DELETE FROM posts WHERE id = 21",
        "UPDATE posts SET id = 30 WHERE id = 2",
    ] {
        warm(&s, &pg, TOP);
        psql.batch_execute(write).expect("write");
        settle(&s);
        assert_eq!(now(&s, TOP).0, truth(&pg, TOP), "stale after {write}");
    }

    // An OFFSET: a row deleted before the window moves the window.
    warm(&s, &pg, SKIP);
    psql.batch_execute("DELETE FROM posts WHERE id = 30")
        .expect("delete the first");
    settle(&s);
    assert_eq!(now(&s, SKIP).0, truth(&pg, SKIP), "stale under an offset");

    // A filter on another column: a post moved to the author enters the result.
    warm(&s, &pg, ADA);
    let key = now(&s, ADA).2;
    psql.batch_execute("UPDATE posts SET author_id = 1 WHERE id = 19")
        .expect("move a post");
    settle(&s);
    assert_eq!(
        now(&s, ADA).0,
        truth(&pg, ADA),
        "stale under a filter (key {key})"
    );
}

/// Found by an attacker's review: each read, with sequential scans off, plans as a Limit over
/// an index scan, and is no top-N read. Each write changes the answer with no change to a row
/// it returned: a heap slot freed by VACUUM taken by a HOT update (a read with no ORDER BY runs
/// in heap order; `a` and `A` tie under a case-insensitive index), or a row gone before a
/// view's OFFSET.
#[test]
fn what_only_looks_like_a_top_n_read_depends_on_its_table() {
    const MORE: &str = "
CREATE TABLE hp (id int PRIMARY KEY, title text NOT NULL);
INSERT INTO hp SELECT i, 'h' || i FROM generate_series(1, 5) i;
CREATE TABLE sk (id int PRIMARY KEY, title text NOT NULL);
INSERT INTO sk SELECT i, 's' || i FROM generate_series(1, 8) i;
CREATE VIEW sk_window AS SELECT id, title FROM sk ORDER BY id OFFSET 1 LIMIT 3;
CREATE TABLE cit (title text COLLATE \"C\" PRIMARY KEY, id int NOT NULL, note text NOT NULL);
CREATE INDEX cit_ci ON cit (title COLLATE ci);
INSERT INTO cit VALUES ('zz', 9, 'n'), ('A', 2, 'n'), ('a', 3, 'n');
GRANT SELECT ON hp, sk, sk_window, cit TO ferry_app, ferry_changes;
ALTER PUBLICATION ferry ADD TABLE hp, sk, cit;";
    let tables = format!("{WATCHED},hp,sk,cit");
    let (_redis, pg, s) = stack_more(MORE, &[("FERRY_CHANGES_TABLES", tables.as_str())]);
    let mut psql = pg.client();
    // One statement per message: VACUUM runs outside a transaction.
    for free in [
        "DELETE FROM hp WHERE id = 2",
        "VACUUM (INDEX_CLEANUP ON) hp",
        "DELETE FROM cit WHERE title = 'zz'",
        "VACUUM (INDEX_CLEANUP ON) cit",
    ] {
        psql.batch_execute(free).expect("free a heap slot");
    }
    settle(&s);
    let cases = [
        (
            "SELECT id, id::text AS title FROM hp LIMIT 3",
            "UPDATE hp SET title = 'moved' WHERE id = 5",
        ),
        (
            "SELECT id, title FROM sk_window",
            "DELETE FROM sk WHERE id = 1",
        ),
        (
            "SELECT id, title, title COLLATE ci AS t2 FROM cit ORDER BY 3 LIMIT 1",
            "UPDATE cit SET note = 'x' WHERE title = 'a'",
        ),
    ];
    for (sql, write) in cases {
        warm(&s, &pg, sql);
        psql.batch_execute(write).expect("write");
        settle(&s);
        assert_eq!(
            now(&s, sql).0,
            truth(&pg, sql),
            "{sql}: stale after {write}"
        );
    }
}

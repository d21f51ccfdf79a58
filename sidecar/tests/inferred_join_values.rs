//! Inferred reads of a join by one value: a view joining an author to their posts, read by
//! `id = $1`, which the planner carries to both tables (`a.id = $1`, `p.author_id = $1`),
//! depends on the rows holding that value in each table. A write to another author's post
//! leaves the entry a hit; a write to this author's row or posts, or a post moved to or from
//! them, reads fresh. A join whose second table is read through the first (`a.id =
//! p.author_id`) depends on that table whole. Against the binary and a private logical
//! Postgres; Postgres's rows judge what is fresh.
mod change_stream_common;
mod inferred_common;

use ferry_testkit::SidecarProcess;
use inferred_common::*;
use serde_json::{json, Value};

const PAGE: &str = "SELECT name, title FROM author_page WHERE id = $1 ORDER BY title";
const POST: &str = "SELECT a.name, p.title FROM posts p JOIN authors a ON a.id = p.author_id \
                    WHERE p.id = $1";

/// (name, title) pairs of `rows`.
fn pairs(rows: &Value) -> Vec<(String, String)> {
    let text = |r: &Value, f: &str| r[f].as_str().unwrap_or_default().to_string();
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| (text(r, "name"), text(r, "title")))
        .collect()
}

fn expect(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Author `id`'s page read until a hit, each answer checked against what Postgres holds.
fn warm(s: &SidecarProcess, sql: &str, id: i64, want: &[(&str, &str)]) {
    let want = expect(want);
    until_hit(s, sql, json!([id]), |rows| {
        assert_eq!(pairs(rows), want, "a stale read of {sql} ({id})")
    });
}

/// The page of author `id` now: (rows, cache status, key).
fn page(s: &SidecarProcess, sql: &str, id: i64) -> (Vec<(String, String)>, String, String) {
    let a = read(s, sql, json!([id]));
    let field = |f: &str| a.body[f].as_str().unwrap_or_default().to_string();
    (pairs(&a.body["rows"]), field("cache"), field("key"))
}

#[test]
fn a_join_read_by_one_value_depends_on_each_tables_rows_of_it() {
    let (redis, pg, s) = stack();
    let mut psql = pg.client();
    // An index for the posts of an author, and every old value in the stream.
    psql.batch_execute(
        "CREATE INDEX ON posts (author_id); ALTER TABLE posts REPLICA IDENTITY FULL;",
    )
    .expect("index");
    settle(&s);
    warm(&s, PAGE, 1, &[("ada", "first"), ("ada", "second")]);
    warm(&s, PAGE, 2, &[("bob", "third")]);
    let key = page(&s, PAGE, 1).2;
    assert!(key.starts_with("~val:"), "not a value read: {key}");
    // The other table's value lives in Redis as long as the entry (600 s), not a flight's.
    let mut conn = redis.conn();
    let other: Vec<String> = redis::cmd("KEYS")
        .arg("*v:~val:public.posts.author_id:1")
        .query(&mut conn)
        .expect("keys");
    assert_eq!(other.len(), 1, "{other:?}");
    let ttl: i64 = redis::cmd("TTL")
        .arg(&other[0])
        .query(&mut conn)
        .expect("ttl");
    assert!(ttl > 300, "the posts' value expires with a flight: {ttl} s");

    // Another author's posts: an edit, a new post. Author 1's page stays a hit.
    psql.batch_execute(
        "UPDATE posts SET title = 'third!' WHERE id = 3; INSERT INTO posts VALUES (4, 2, 'fourth');",
    )
    .expect("author 2's posts");
    settle(&s);
    assert_eq!(
        page(&s, PAGE, 1).1,
        "hit",
        "a write to author 2's posts dropped author 1's page"
    );
    assert_eq!(
        page(&s, PAGE, 2).0,
        expect(&[("bob", "fourth"), ("bob", "third!")])
    );

    // This author's post edited: fresh (the posts' value, not the authors' that names it).
    psql.execute("UPDATE posts SET title = 'first!' WHERE id = 1", &[])
        .expect("edit");
    settle(&s);
    assert_eq!(
        page(&s, PAGE, 1).0,
        expect(&[("ada", "first!"), ("ada", "second")]),
        "an edit of the author's post was served stale"
    );
    // A post moved to the author, then one moved away (its old value).
    warm(&s, PAGE, 1, &[("ada", "first!"), ("ada", "second")]);
    psql.execute("UPDATE posts SET author_id = 1 WHERE id = 3", &[])
        .expect("move in");
    settle(&s);
    assert_eq!(
        page(&s, PAGE, 1).0,
        expect(&[("ada", "first!"), ("ada", "second"), ("ada", "third!")])
    );
    warm(
        &s,
        PAGE,
        1,
        &[("ada", "first!"), ("ada", "second"), ("ada", "third!")],
    );
    psql.execute("UPDATE posts SET author_id = 2 WHERE id = 2", &[])
        .expect("move out");
    settle(&s);
    assert_eq!(
        page(&s, PAGE, 1).0,
        expect(&[("ada", "first!"), ("ada", "third!")])
    );
    // The author renamed.
    warm(&s, PAGE, 1, &[("ada", "first!"), ("ada", "third!")]);
    psql.execute("UPDATE authors SET name = 'ada!' WHERE id = 1", &[])
        .expect("rename");
    settle(&s);
    assert_eq!(
        page(&s, PAGE, 1).0,
        expect(&[("ada!", "first!"), ("ada!", "third!")])
    );

    // A post with its author: the authors row is found through the post, by no parameter.
    // The read depends on authors whole: a rename of the author reads fresh.
    warm(&s, POST, 1, &[("ada!", "first!")]);
    assert!(
        !page(&s, POST, 1).2.starts_with("~val:"),
        "a join through a column named by a value"
    );
    psql.execute("UPDATE authors SET name = 'ada' WHERE id = 1", &[])
        .expect("rename back");
    settle(&s);
    assert_eq!(page(&s, POST, 1).0, expect(&[("ada", "first!")]));
}

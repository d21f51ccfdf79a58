//! DDL by a writer that bypasses Ferry that changes what a read of a watched table returns with
//! no row in the stream: a table that starts inheriting from it, row-level security switched
//! on, a revoked privilege. A read that declared the table (`cache.tables`) answered its entry
//! from before the commit past `changes.max_lag_ms`, until its TTL (an attacker's review,
//! 2026-12-05: 3 of 3 failed). The watched tables' definitions now cover privileges, row-level
//! security, policies and inheritance (`changes::setup::definitions`), and a child the
//! publication lacks leaves the table uncovered (reads bypass). Postgres's answer to the same
//! statement, uncached, is the judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::time::{Duration, Instant};

mod change_stream_common;
use change_stream_common::*;

const COUNT: &str = "SELECT count(*)::int AS n FROM items";

/// change_stream_common's sidecar, logged in as the least-privilege ferry_app (not postgres).
fn start_app(redis: &RedisServer, pg: &PgServer) -> SidecarProcess {
    let s = spawn_as(&redis.url(), pg, &pg.url_as("ferry_app"), &[]);
    wait_caught_up(&s);
    s
}

fn cached_count(s: &SidecarProcess) -> (Option<i64>, String) {
    let a = read(s, COUNT, json!([]), &["items"]);
    (
        a.body["rows"][0]["n"].as_i64(),
        a.body["cache"].as_str().unwrap_or_default().to_string(),
    )
}

/// The same statement, not cached: what Postgres answers ferry_app now.
fn plain_count(s: &SidecarProcess) -> (u16, serde_json::Value) {
    let a = s.client.query(json!({"sql": COUNT, "params": []}));
    (a.status, a.body)
}

fn warm(s: &SidecarProcess) {
    ferry_testkit::wait_until("a hit", Duration::from_secs(10), || {
        let (n, cache) = cached_count(s);
        assert_eq!(n, Some(1000));
        cache == "hit"
    });
}

/// Reads for 2 s after the bound (many marks, many DDL checks); the first stale one fails.
fn never_stale(s: &SidecarProcess, committed: Instant, fresh: Option<i64>, what: &str) {
    after_bound(committed);
    // Generous: many marks and DDL checks (every 50 ms) have run by then.
    std::thread::sleep(Duration::from_millis(1500));
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let (n, cache) = cached_count(s);
        assert_eq!(
            n,
            fresh,
            "{what}: a read {:?} after the commit answered the count from before it ({cache})",
            committed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_table_that_starts_inheriting_from_a_watched_one_adds_its_rows() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start_app(&redis, &pg);
    warm(&s);
    let mut psql = pg.client();
    psql.batch_execute(
        "CREATE TABLE items_more (LIKE items INCLUDING DEFAULTS);
         INSERT INTO items_more (id, name, price) SELECT g, 'more', 1 FROM generate_series(1, 5) g;
         ALTER TABLE items_more INHERIT items;",
    )
    .expect("inherit");
    let committed = Instant::now();
    let n: i64 = psql
        .query_one(COUNT, &[])
        .expect("count")
        .get::<_, i32>(0)
        .into();
    assert_eq!(
        n, 1005,
        "Postgres reads the child's rows through the parent"
    );
    never_stale(&s, committed, Some(1005), "ALTER TABLE ... INHERIT");
}

#[test]
fn row_level_security_switched_on_hides_rows_from_cached_reads_too() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start_app(&redis, &pg);
    warm(&s);
    let mut psql = pg.client();
    // No policy: ferry_app (not the owner) now sees no row of items.
    psql.batch_execute("ALTER TABLE items ENABLE ROW LEVEL SECURITY")
        .expect("rls");
    let committed = Instant::now();
    let (status, body) = plain_count(&s);
    assert_eq!(status, 200, "{body:?}");
    assert_eq!(
        body["rows"][0]["n"], 0,
        "Postgres answers ferry_app no rows"
    );
    never_stale(&s, committed, Some(0), "ENABLE ROW LEVEL SECURITY");
}

#[test]
fn a_revoked_select_is_not_answered_from_the_cache() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start_app(&redis, &pg);
    warm(&s);
    let mut psql = pg.client();
    psql.batch_execute("REVOKE SELECT ON items FROM ferry_app")
        .expect("revoke");
    let committed = Instant::now();
    let (status, body) = plain_count(&s);
    assert_ne!(status, 200, "Postgres refuses ferry_app: {body:?}");
    after_bound(committed);
    std::thread::sleep(Duration::from_millis(1500));
    let a = s.client.query(json!({
        "sql": COUNT, "params": [],
        "cache": {"ttl_s": 600, "tables": ["items"]},
    }));
    assert_ne!(
        a.status, 200,
        "a read the role may no longer make answered from the cache: {:?}",
        a.body
    );
}

#[test]
fn a_child_published_but_not_watched_leaves_its_parent_uncached() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start_app(&redis, &pg);
    warm(&s);
    let mut psql = pg.client();
    // The child joins the publication, but the stream watches `items` and `orders` only: its
    // row changes name no entry, yet every read of `items` reads its rows.
    psql.batch_execute(
        "CREATE TABLE items_more (LIKE items INCLUDING DEFAULTS);
         ALTER TABLE items_more INHERIT items;
         GRANT SELECT ON items_more TO ferry_app, ferry_changes;
         ALTER PUBLICATION ferry ADD TABLE items_more;",
    )
    .expect("a published child");
    // Long enough for the DDL check to drop the entry and a read to fill it again, were the
    // table still cached.
    after_bound(Instant::now());
    let _ = cached_count(&s);
    let _ = cached_count(&s);
    psql.batch_execute(
        "INSERT INTO items_more (id, name, price) SELECT g, 'more', 1 FROM generate_series(1, 5) g",
    )
    .expect("rows in the child");
    never_stale(
        &s,
        Instant::now(),
        Some(1005),
        "a row in a child the stream does not watch",
    );
}

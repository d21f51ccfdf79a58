//! Postgres writes a commit to the WAL before other sessions can see it: the commit record is
//! flushed, then the transaction leaves the running set. The change stream reads the WAL, so it
//! can invalidate a commit that no read can see yet; a read that misses in that window reads
//! the old row and caches it under the new versions, and it is served as fresh until the next
//! write of that row, past any bound. Found by the blog bench with the servers on one core (a
//! committing backend descheduled between the two steps): 12 and 41 stale reads in two runs.
//!
//! The adversary holds the window open: a synchronous standby that never answers keeps the
//! writer's commit flushed and invisible (Postgres's own `pg_stat_activity` shows it waiting
//! in `SyncRep`, and its own sessions still see the old row). Ferry's sessions commit without
//! waiting for a standby, so only the writer waits. Judged by Postgres's rows after the bound.
mod change_stream_common;
mod inferred_common;

use change_stream_common::after_bound;
use ferry_testkit::wait_until;
use inferred_common::*;
use serde_json::json;
use std::time::{Duration, Instant};

const POST: &str = "SELECT id, title FROM posts WHERE id = $1";

/// Post 1's title as Ferry answers it, and the cache status.
fn title(s: &ferry_testkit::SidecarProcess) -> (String, String) {
    let a = read(s, POST, json!([1]));
    let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    (field(&a.body["rows"][0]["title"]), field(&a.body["cache"]))
}

/// Post 1's title as a session of Postgres's own sees it.
fn seen_by_postgres(pg: &mut postgres::Client) -> String {
    pg.query_one("SELECT title FROM posts WHERE id = 1", &[])
        .expect("title")
        .get(0)
}

/// `ALTER SYSTEM <change>`, then the configuration reloaded (each alone: ALTER SYSTEM refuses to
/// run in a transaction block).
fn standby(pg: &mut postgres::Client, change: &str) {
    pg.batch_execute(&format!("ALTER SYSTEM {change}"))
        .expect(change);
    pg.batch_execute("SELECT pg_reload_conf()").expect("reload");
}

#[test]
fn a_commit_the_stream_sees_before_sessions_do_is_never_cached_as_fresh() {
    let own = "ALTER ROLE ferry_app SET synchronous_commit = local;
               ALTER ROLE ferry_changes SET synchronous_commit = local;";
    let (_redis, pg, s) = stack_more(own, &[]);
    until_hit(&s, POST, json!([1]), |rows| {
        assert_eq!(rows[0]["title"], "first")
    });
    let mut admin = pg.client();
    standby(&mut admin, "SET synchronous_standby_names = 'nobody'");
    let url = pg.url();
    let writer = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("writer");
        c.execute("UPDATE posts SET title = 'edited' WHERE id = 1", &[])
    });
    wait_until(
        "the writer's commit, flushed, to wait for its standby",
        Duration::from_secs(10),
        || {
            let n: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                    &[],
                )
                .expect("pg_stat_activity")
                .get(0);
            n == 1
        },
    );
    // The stream has had the commit for a while (well inside the bound, so a stream that
    // applied it keeps the cache open), and no session sees it.
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(seen_by_postgres(&mut admin), "first");
    // Reads meanwhile may answer the old title: nothing acknowledged the write.
    for _ in 0..5 {
        let (t, _) = title(&s);
        assert_eq!(t, "first", "a title no session of Postgres could see");
        std::thread::sleep(Duration::from_millis(20));
    }
    standby(&mut admin, "RESET synchronous_standby_names");
    writer
        .join()
        .expect("the writer")
        .expect("the update commits");
    let acknowledged = Instant::now();
    assert_eq!(seen_by_postgres(&mut admin), "edited");
    after_bound(acknowledged);
    for _ in 0..20 {
        let (t, cache) = title(&s);
        assert_eq!(
            t, "edited",
            "a read after the bound answered the title from before the commit ({cache})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // And it is cached again.
    until_hit(&s, POST, json!([1]), |rows| {
        assert_eq!(rows[0]["title"], "edited")
    });
}

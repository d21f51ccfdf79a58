//! A publication that stops covering a watched table (`ALTER PUBLICATION ... DROP TABLE`,
//! `SET (publish = ...)` without an operation, or a row filter: `ADD TABLE items WHERE (...)`)
//! silently stops that table's invalidation. The
//! consumer checks coverage with every heartbeat: while anything is uncovered it publishes no
//! mark, so `/readyz` leaves `caught_up` and every sidecar's cached reads bypass; once covered
//! again, the tables are invalidated whole (their changes meanwhile never reached the stream).
//! A writer that bypasses Ferry judges: no read returns the row from before its UPDATE.
mod change_stream_common;

use change_stream_common::*;
use ferry_testkit::{wait_until, RedisServer};
use std::time::Duration;

#[test]
fn lost_coverage_stops_the_cache_until_it_is_back() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    let before = name_of(&s, 1).0;
    assert_eq!(name_of(&s, 1), (before.clone(), "hit".into()));
    for (uncover, cover) in [
        (
            "ALTER PUBLICATION ferry DROP TABLE items",
            "ALTER PUBLICATION ferry ADD TABLE items",
        ),
        (
            "ALTER PUBLICATION ferry SET (publish = 'insert, delete, truncate')",
            "ALTER PUBLICATION ferry SET (publish = 'insert, update, delete, truncate')",
        ),
        // A row filter: a change to a row outside it, old and new, never reaches the stream.
        (
            "ALTER PUBLICATION ferry DROP TABLE items;
             ALTER PUBLICATION ferry ADD TABLE items WHERE (id > 100)",
            "ALTER PUBLICATION ferry DROP TABLE items; ALTER PUBLICATION ferry ADD TABLE items",
        ),
    ] {
        pg.client().batch_execute(uncover).expect("uncover");
        wait_until(
            "the stream to stop serving",
            Duration::from_secs(10),
            || changes(&s)["state"] != "caught_up",
        );
        let written = format!("written while uncovered: {uncover}");
        pg.client()
            .execute("UPDATE items SET name = $1 WHERE id = 1", &[&written])
            .expect("update");
        for _ in 0..5 {
            let (name, cache) = name_of(&s, 1);
            assert_eq!(name, written, "an uncovered change was missed ({cache})");
        }
        pg.client().batch_execute(cover).expect("cover");
        wait_caught_up(&s);
        until_hit(&s, 1, &written);
    }
}

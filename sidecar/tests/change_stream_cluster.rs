//! A writer that bypasses Ferry (psql), with the sidecar binary on a Redis Cluster: Postgres's
//! change stream invalidates what the write touched (versions on many slots, the watermark's
//! two keys in one), so after the freshness bound no read returns the old row, and hits come
//! back with the new one.
mod change_stream_common;
use change_stream_common as common;
use ferry_testkit::RedisCluster;
use std::time::Instant;

#[test]
fn an_outside_writer_is_seen_through_the_cache_on_a_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let pg = common::logical_pg();
    let s = common::spawn_on(&cluster.urls(), &pg, &[("FERRY_REDIS_CLUSTER", "true")]);
    common::wait_caught_up(&s);
    for id in [1, 2, 3] {
        common::name_of(&s, id);
        common::until_hit(&s, id, &format!("item {id}"));
    }
    // The outside writer, straight into Postgres.
    pg.client()
        .execute(
            "UPDATE items SET name = 'renamed in psql' WHERE id = 2",
            &[],
        )
        .expect("outside write");
    let committed = Instant::now();
    common::after_bound(committed);
    assert_eq!(common::name_of(&s, 2).0, "renamed in psql");
    common::until_hit(&s, 2, "renamed in psql");
    // The others read as they were (their entries depend on the whole table, so they refill).
    common::until_hit(&s, 1, "item 1");
    common::until_hit(&s, 3, "item 3");
}

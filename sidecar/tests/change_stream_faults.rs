//! The change stream under faults, on the binary: the consuming sidecar SIGKILLed during writes,
//! Redis stopped during writes, two sidecars with the leader killed, and a server or role that
//! cannot stream. Fresh reads judged by Postgres's rows; the slot's holder by pg_stat_replication.
use ferry_testkit::{wait_until, RedisServer};
use serde_json::json;
use std::time::{Duration, Instant};

mod change_stream_common;
use change_stream_common::*;

fn kill(s: &mut ferry_testkit::SidecarProcess) {
    let _ = s.child.kill();
    let _ = s.child.wait();
}

#[test]
fn a_sidecar_killed_during_writes_replays_before_it_serves_the_cache() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let mut s = start(&redis, &pg);
    until_hit(&s, 1, "item 1");
    kill(&mut s);
    // Written while no sidecar consumed the slot: only the slot remembers it.
    pg.client()
        .execute("UPDATE items SET name = 'while down' WHERE id = 1", &[])
        .expect("update");
    let restarted = Instant::now();
    let s = spawn(&redis, &pg);
    // The very first read after the restart: the entry in Redis is the old row.
    let (name, cache) = name_of(&s, 1);
    assert_eq!(name, "while down", "served the pre-write row ({cache})");
    wait_caught_up(&s);
    println!(
        "FIGURES restart: first read {cache} (fresh); caught up {:?} after the restart",
        restarted.elapsed()
    );
    until_hit(&s, 1, "while down");
}

#[test]
fn redis_stopped_during_writes_loses_no_invalidation() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    until_hit(&s, 1, "item 1");
    redis.pause();
    let mut psql = pg.client();
    psql.execute("UPDATE items SET name = 'redis was down' WHERE id = 1", &[])
        .expect("update");
    let written: String = psql
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .expect("lsn")
        .get(0);
    // Whether the slot's confirmed position has passed the write (Postgres's view).
    let mut confirmed = || -> bool {
        psql.query_one(
            "SELECT confirmed_flush_lsn >= $1::text::pg_lsn FROM pg_replication_slots \
             WHERE slot_name = 'ferry'",
            &[&written],
        )
        .expect("slot")
        .get(0)
    };
    // Longer than the bound and the stream's 1 s status interval: it cannot confirm or mark
    // anything meanwhile.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        !confirmed(),
        "confirmed a change whose invalidation Redis never took"
    );
    let during = name_of(&s, 1);
    assert_eq!(during.0, "redis was down", "read while Redis is stopped");
    redis.resume();
    // The first read once Redis answers again: the old entry is still in it.
    let (name, cache) = name_of(&s, 1);
    assert_eq!(name, "redis was down", "served the pre-write row ({cache})");
    until_hit(&s, 1, "redis was down");
    wait_until(
        "the slot to be confirmed",
        Duration::from_secs(10),
        &mut confirmed,
    );
}

fn stream_holder(pg: &ferry_testkit::PgServer) -> Option<i32> {
    pg.client()
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'ferry' AND active",
            &[],
        )
        .expect("slots")
        .map(|r| r.get(0))
}

#[test]
fn two_sidecars_one_consumer_and_the_survivor_takes_over() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let a = start(&redis, &pg);
    let b = start(&redis, &pg);
    let role = |s: &ferry_testkit::SidecarProcess| changes(s)["role"].as_str().map(String::from);
    wait_until(
        "one leader and one follower",
        Duration::from_secs(10),
        || {
            let mut roles = [role(&a), role(&b)];
            roles.sort();
            roles == [Some("follower".into()), Some("leader".into())]
        },
    );
    let (mut leader, survivor) = if role(&a).as_deref() == Some("leader") {
        (a, b)
    } else {
        (b, a)
    };
    let before = stream_holder(&pg).expect("the slot is held");
    until_hit(&survivor, 1, "item 1");
    // A write through the follower's view: invalidations from the leader reach every sidecar.
    pg.client()
        .execute(
            "UPDATE items SET name = 'seen everywhere' WHERE id = 1",
            &[],
        )
        .expect("update");
    after_bound(Instant::now());
    assert_eq!(name_of(&survivor, 1).0, "seen everywhere");

    kill(&mut leader);
    let killed = Instant::now();
    pg.client()
        .execute(
            "UPDATE items SET name = 'after the leader died' WHERE id = 1",
            &[],
        )
        .expect("update");
    after_bound(Instant::now());
    assert_eq!(
        name_of(&survivor, 1).0,
        "after the leader died",
        "no leader: reads must bypass, not serve the old entry"
    );
    wait_until("the survivor to lead", Duration::from_secs(15), || {
        role(&survivor).as_deref() == Some("leader")
    });
    println!(
        "FIGURES takeover: the survivor leads {:?} after the SIGKILL",
        killed.elapsed()
    );
    let after = stream_holder(&pg).expect("the slot is held again");
    assert_ne!(before, after, "another backend holds the slot");
    until_hit(&survivor, 1, "after the leader died");
    let slots: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .expect("slots")
        .get(0);
    assert_eq!(slots, 1, "one slot, whoever consumes it");
}

/// A server or role that cannot stream stops the binary at startup, naming what is missing.
#[test]
fn missing_prerequisites_are_named_at_startup() {
    let redis = RedisServer::start();
    let plain = ferry_testkit::PgServer::start();
    plain.setup_demo_schema();
    let logical = logical_pg();
    logical
        .client()
        .batch_execute("CREATE ROLE no_repl LOGIN; GRANT SELECT ON items TO no_repl;")
        .expect("role");
    let no_repl = logical.url().replace("postgres@", "no_repl@");
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    for (url, changes_url, expect) in [
        (plain.url(), String::new(), "wal_level = logical"),
        (logical.url(), no_repl, "REPLICATION"),
    ] {
        let out = std::process::Command::new(BIN)
            .env_clear()
            .env("FERRY_CONFIG", sample)
            .env("FERRY_SECRET", "a-test-secret-of-enough-length")
            .env("FERRY_REDIS_URL", redis.url())
            .env("FERRY_DATABASE_URL", &url)
            .envs(ferry_testkit::process::roles_env(&url))
            .env("FERRY_CHANGES_ENABLED", "true")
            .env("FERRY_CHANGES_URL", &changes_url)
            .env("FERRY_LISTEN", "127.0.0.1:0")
            .output()
            .expect("run the binary");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(expect), "{expect}: {err}");
    }
}

/// An entry that names no table (only a cache-wide epoch move can drop it), cached; then its
/// sidecar killed and the slot lost while nobody reads it (more WAL than
/// max_slot_wal_keep_size). Returns how to read the entry: its `cache` status.
fn an_untracked_entry_and_a_lost_slot(
    redis: &RedisServer,
    pg: &ferry_testkit::PgServer,
) -> impl Fn(&ferry_testkit::SidecarProcess) -> String {
    // Cached under a key of its own, naming no table: nothing the stream reads names it.
    let untracked = |s: &ferry_testkit::SidecarProcess| {
        let a = s.client.query(json!({
            "sql": "SELECT name FROM items WHERE id = $1", "params": [3],
            "cache": {"ttl_s": 600, "key": "untracked:3"},
        }));
        assert_eq!(a.status, 200, "{:?}", a.body);
        a.body["cache"].as_str().unwrap_or_default().to_string()
    };
    let mut s = start(redis, pg);
    wait_until("an untracked entry cached", Duration::from_secs(10), || {
        untracked(&s) == "hit"
    });
    kill(&mut s);
    let mut psql = pg.client();
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
        "CREATE TABLE filler (id int, pad text)",
    ] {
        psql.batch_execute(sql).expect("bound the slot");
    }
    wait_until("the slot to be lost", Duration::from_secs(60), || {
        for sql in [
            "INSERT INTO filler SELECT g, repeat('x', 500) FROM generate_series(1, 2000) g",
            "SELECT pg_switch_wal()",
            "CHECKPOINT",
        ] {
            psql.batch_execute(sql).expect("wal");
        }
        slot_status(pg) == "lost"
    });
    untracked
}

/// The slot's `wal_status` ("" when there is none).
fn slot_status(pg: &ferry_testkit::PgServer) -> String {
    pg.client()
        .query_opt(
            "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = 'ferry'",
            &[],
        )
        .expect("slot")
        .map(|r| r.get(0))
        .unwrap_or_default()
}

#[test]
fn a_lost_slot_is_made_anew_and_everything_cached_is_dropped() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let untracked = an_untracked_entry_and_a_lost_slot(&redis, &pg);
    let s = start(&redis, &pg);
    // Never the old entry; a miss once the cache is in use (bypass while it is not).
    wait_until("a read through the cache", Duration::from_secs(10), || {
        let status = untracked(&s);
        assert_ne!(status, "hit", "an entry cached before the slot was lost");
        status == "miss"
    });
    assert_ne!(slot_status(&pg), "lost", "a fresh slot");
}

/// The same, but Redis stops answering (SIGSTOP) before the new slot's first session reaches
/// it, so that session ends before its flush; the next one finds the slot already there. The
/// flush the new slot owes must outlive the session that made it.
#[test]
fn the_flush_a_new_slot_owes_outlives_the_session_that_made_it() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let untracked = an_untracked_entry_and_a_lost_slot(&redis, &pg);
    redis.pause();
    // Not ready until Redis answers: started aside, while this thread watches the slot.
    let s = std::thread::scope(|scope| {
        let starting = scope.spawn(|| spawn(&redis, &pg));
        wait_until("a new slot", Duration::from_secs(20), || {
            !matches!(slot_status(&pg).as_str(), "" | "lost")
        });
        // Long enough for the session that made it to give up on Redis and end.
        std::thread::sleep(Duration::from_secs(3));
        redis.resume();
        starting.join().expect("the sidecar starts")
    });
    wait_until("a read through the cache", Duration::from_secs(20), || {
        let status = untracked(&s);
        assert_ne!(status, "hit", "an entry cached before the slot was lost");
        status == "miss"
    });
}

/// Postgres stopped and started under the stream. While it is down nothing proves the cache
/// fresh (a writer elsewhere could commit), so cached reads go to Postgres and fail fast; once
/// it is back the stream resumes from the slot, a write made then is seen, and hits return.
#[test]
fn postgres_stopped_under_the_stream_answers_fast_and_resumes() {
    let (redis, mut pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    until_hit(&s, 1, "item 1");
    pg.stop();
    // Past the bound: the consumer cannot mark, so no sidecar vouches for the cache.
    std::thread::sleep(MAX_LAG * 2);
    let started = Instant::now();
    let a = s.client.query(json!({
        "sql": "SELECT name FROM items WHERE id = $1", "params": [1],
        "cache": {"ttl_s": 600, "tables": ["items"]},
    }));
    let took = started.elapsed();
    assert!(matches!(a.status, 502..=504), "{}: {:?}", a.status, a.body);
    assert!(a.body["error"]["code"].is_string(), "{:?}", a.body);
    assert!(took < Duration::from_secs(5), "answered in {took:?}");
    pg.start_again();
    pg.client()
        .execute(
            "UPDATE items SET name = 'after the restart' WHERE id = 1",
            &[],
        )
        .expect("update");
    let committed = Instant::now();
    wait_caught_up(&s);
    after_bound(committed);
    assert_eq!(name_of(&s, 1).0, "after the restart");
    until_hit(&s, 1, "after the restart");
    println!(
        "FIGURES postgres stopped: a cached read answered {} in {took:?}",
        a.status
    );
}

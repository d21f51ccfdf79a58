//! What the change-stream tests share: a logical Postgres, the binary with `[changes]` on,
//! cached reads that declare their tables, and waiting out the freshness bound.
#![allow(dead_code)]
use ferry_testkit::{client::Answer, wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
/// The bound under test (and the mark interval): short, so the tests wait little.
pub const MAX_LAG: Duration = Duration::from_millis(400);

pub fn logical_pg() -> PgServer {
    let pg = PgServer::start_logical();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, item_id int NOT NULL, qty int NOT NULL);
             INSERT INTO orders VALUES (1, 1, 5);
             GRANT SELECT ON orders TO ferry_changes;
             ALTER PUBLICATION ferry ADD TABLE orders;",
        )
        .expect("orders");
    pg
}

pub fn start(redis: &RedisServer, pg: &PgServer) -> SidecarProcess {
    let s = spawn(redis, pg);
    wait_caught_up(&s);
    s
}

/// The binary with `[changes]` on, ready (it may still be catching up).
pub fn spawn(redis: &RedisServer, pg: &PgServer) -> SidecarProcess {
    spawn_with(redis, pg, &[])
}

/// The same, with `extra` environment.
pub fn spawn_with(redis: &RedisServer, pg: &PgServer, extra: &[(&str, &str)]) -> SidecarProcess {
    spawn_on(&redis.url(), pg, extra)
}

/// The same, on the Redis at `redis_url` (one server, or a cluster's seeds with `extra`).
pub fn spawn_on(redis_url: &str, pg: &PgServer, extra: &[(&str, &str)]) -> SidecarProcess {
    spawn_as(redis_url, pg, &pg.url(), extra)
}

/// The same, with requests logged in at `pg_url` (a least-privilege role, say).
pub fn spawn_as(
    redis_url: &str,
    pg: &PgServer,
    pg_url: &str,
    extra: &[(&str, &str)],
) -> SidecarProcess {
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    // The stream as the least-privilege role scripts/demo.sql makes (REPLICATION, SELECT).
    let stream_url = pg.url().replace("postgres@", "ferry_changes@");
    let mut env = vec![
        ("FERRY_CONFIG", sample),
        ("FERRY_CHANGES_URL", stream_url.as_str()),
        ("FERRY_CHANGES_ENABLED", "true"),
        ("FERRY_CHANGES_TABLES", "orders"),
        ("FERRY_CHANGES_MAX_LAG_MS", "400"),
        ("FERRY_CHANGES_HEARTBEAT_MS", "50"),
    ];
    env.extend_from_slice(extra);
    SidecarProcess::start(BIN, redis_url, pg_url, &env, Stdio::null())
}

pub fn changes(s: &SidecarProcess) -> Value {
    s.client.get("/readyz").body["changes"].clone()
}

pub fn wait_caught_up(s: &SidecarProcess) {
    wait_until(
        "the change stream to catch up",
        Duration::from_secs(30),
        || changes(s)["state"] == "caught_up",
    );
}

pub fn read(s: &SidecarProcess, sql: &str, params: Value, tables: &[&str]) -> Answer {
    let a = s.client.query(json!({
        "sql": sql, "params": params,
        "cache": {"ttl_s": 600, "tables": tables},
    }));
    assert_eq!(a.status, 200, "{:?}", a.body);
    a
}

pub fn name_of(s: &SidecarProcess, id: i32) -> (String, String) {
    let a = read(
        s,
        "SELECT name FROM items WHERE id = $1",
        json!([id]),
        &["items"],
    );
    (
        a.body["rows"][0]["name"]
            .as_str()
            .unwrap_or("<none>")
            .to_string(),
        a.body["cache"].as_str().unwrap_or_default().to_string(),
    )
}

/// Waits out the bound from `committed`: any read from then on must be fresh.
pub fn after_bound(committed: Instant) {
    let until = committed + MAX_LAG + Duration::from_millis(20);
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
}

/// Reads `id` until it is a cache hit again (the stream does not just switch caching off).
pub fn until_hit(s: &SidecarProcess, id: i32, expect: &str) {
    wait_until("a hit with the fresh row", Duration::from_secs(10), || {
        let (name, cache) = name_of(s, id);
        assert_eq!(name, expect, "a read after the bound returned another row");
        cache == "hit"
    });
}

/// How many reads (started at, version seen) returned a version older than one committed
/// (at, version) more than `bound` before they started.
pub fn stale_reads(commits: &[(Instant, i64)], reads: &[(Instant, i64)], bound: Duration) -> usize {
    reads
        .iter()
        .filter(|(started, seen)| {
            let must = commits
                .iter()
                .filter(|(at, _)| *at + bound < *started)
                .map(|(_, n)| *n)
                .max()
                .unwrap_or(0);
            *seen < must
        })
        .count()
}

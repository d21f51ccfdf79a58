//! A dying Redis against the binary's event-loop Redis path (each worker's multiplexed
//! connection, used by cache commands and read-through lookups). SIGSTOP: commands answer 503
//! at the I/O timeout, never hang, and cached reads are still served (from Postgres). SIGKILL
//! and restart: both recover without a sidecar restart, and no read ever fails.
use ferry_testkit::{self as common, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn get(c: &common::Client) -> (common::client::Answer, Duration) {
    let start = Instant::now();
    let a = c.cache(json!({"op": "get", "key": "greeting"}));
    (a, start.elapsed())
}

fn read(c: &common::Client) -> (common::client::Answer, Duration) {
    let start = Instant::now();
    let a = c.query(json!({"sql": "SELECT name FROM items WHERE id = 3", "cache": {"ttl_s": 300}}));
    assert_eq!(
        a.status, 200,
        "a read failed because Redis failed: {:?}",
        a.body
    );
    assert_eq!(a.body["rows"][0]["name"], "item 3");
    (a, start.elapsed())
}

#[test]
fn a_stopped_or_restarted_redis_answers_fast_then_recovers() {
    let mut redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[
            ("FERRY_REDIS_IO_TIMEOUT_MS", "500"),
            ("FERRY_REDIS_CHECKOUT_TIMEOUT_MS", "500"),
            ("FERRY_REDIS_CONNECT_TIMEOUT_MS", "300"),
        ],
        Stdio::null(),
    );
    let c = &s.client;
    let set = c.cache(json!({"op": "set", "key": "greeting", "value": "hello"}));
    assert_eq!(set.status, 200, "{:?}", set.body);
    assert_eq!(get(c).0.body["value"], "hello");
    read(c);
    assert_eq!(read(c).0.body["cache"], "hit");

    // SIGSTOP: connections stay open but nothing answers.
    redis.pause();
    // The read first: its lookup meets the hang on the worker's multiplexed connection.
    let (r, took_read) = read(c);
    let (a, took_cmd) = get(c);
    redis.resume();
    assert_eq!(a.status, 503, "{:?}", a.body);
    assert_eq!(a.code(), "cache_unavailable");
    assert_eq!(
        r.body["cache"], "bypass",
        "served from Postgres while Redis hangs"
    );
    println!("FIGURES redis stopped: command 503 in {took_cmd:?}, read served in {took_read:?}");
    assert!(took_cmd < Duration::from_secs(3), "took {took_cmd:?}");
    assert!(took_read < Duration::from_secs(3), "took {took_read:?}");
    common::wait_until("commands to work again", Duration::from_secs(5), || {
        get(c).0.body["value"] == "hello"
    });
    common::wait_until("hits again", Duration::from_secs(5), || {
        read(c).0.body["cache"] == "hit"
    });

    // SIGKILL: every connection dies; after the restart (data gone) both paths work again.
    redis.kill();
    let (a, took) = get(c);
    assert_eq!(a.status, 503, "{:?}", a.body);
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(read(c).0.body["cache"], "bypass");
    redis.restart();
    let restarted = Instant::now();
    common::wait_until("commands to work again", Duration::from_secs(5), || {
        c.cache(json!({"op": "set", "key": "greeting", "value": "again"}))
            .status
            == 200
    });
    let commands_back = restarted.elapsed();
    common::wait_until("hits again", Duration::from_secs(5), || {
        read(c).0.body["cache"] == "hit"
    });
    println!(
        "FIGURES redis restarted: commands back after {commands_back:?}, hits after {:?}",
        restarted.elapsed()
    );
    assert_eq!(get(c).0.body["value"], "again");
}

//! Cache commands run on each worker's multiplexed Redis connection. When Redis stops
//! answering they fail fast with 503 (never hang); when it dies and comes back they recover
//! without a sidecar restart.
use ferry_testkit as common;
use serde_json::json;
use std::time::{Duration, Instant};

fn get(c: &common::Client) -> (common::client::Answer, Duration) {
    let start = Instant::now();
    let a = c.cache(json!({"op": "get", "key": "greeting"}));
    (a, start.elapsed())
}

#[test]
fn a_stopped_or_restarted_redis_answers_fast_then_recovers() {
    let mut stack = common::Stack::start();
    let c = &stack.client;
    let set = c.cache(json!({"op": "set", "key": "greeting", "value": "hello"}));
    assert_eq!(set.status, 200, "{:?}", set.body);
    assert_eq!(get(c).0.body["value"], "hello");

    // SIGSTOP: the connection is open but nothing answers.
    stack.redis.pause();
    let (a, took) = get(c);
    stack.redis.resume();
    assert_eq!(a.status, 503, "{:?}", a.body);
    assert_eq!(a.code(), "cache_unavailable");
    // The harness' I/O timeout is 500 ms: answered at it, not at the request deadline.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    common::wait_until("commands to work again", Duration::from_secs(5), || {
        get(c).0.body["value"] == "hello"
    });

    // SIGKILL: every connection dies; after the restart (data gone) commands work again.
    stack.redis.kill();
    let (a, took) = get(c);
    assert_eq!(a.status, 503, "{:?}", a.body);
    assert!(took < Duration::from_secs(3), "took {took:?}");
    stack.redis.restart();
    let restarted = Instant::now();
    common::wait_until("commands to work again", Duration::from_secs(5), || {
        c.cache(json!({"op": "set", "key": "greeting", "value": "again"}))
            .status
            == 200
    });
    println!(
        "FIGURES cache commands back {:?} after the restart",
        restarted.elapsed()
    );
    assert_eq!(get(c).0.body["value"], "again");
}

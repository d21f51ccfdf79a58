//! Per-user rate limits (`identity.rate_per_s`, `identity.burst`): one end user flooding the
//! sidecar gets 429 with Retry-After past their burst, and nothing past the limit runs; another
//! user is not slowed; two sidecar binaries on the same Redis share the count; Redis down keeps
//! each user to the rate in each sidecar's own memory (never a 5xx, never unbounded). Postgres's
//! rows and Redis's keys judge.
use ferry_testkit::{Client, PgServer, RedisServer, SidecarProcess, Stack};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
use serde_json::{json, Value};

/// One request a second on average, ten at once: a burst of 30 lets through 10, plus one for
/// each second the burst takes (so a slow machine cannot fail these tests).
const BURST: u32 = 10;

fn stack() -> Stack {
    Stack::start_with(|c| {
        c.identity.rate_per_s = 1;
        c.identity.burst = BURST;
    })
}

fn who(sub: &str) -> Value {
    json!({"role": "authenticated", "claims": {"sub": sub}})
}

fn notes_by(stack: &Stack, owner: &str) -> i64 {
    stack
        .pg
        .client()
        .query_one("SELECT count(*) FROM notes WHERE owner = $1", &[&owner])
        .expect("count")
        .get(0)
}

/// Sends `n` writes as `sub`, all at once, over the given clients in turn; returns how many
/// were admitted, after checking every refusal, and the most the limit may have admitted.
fn flood(clients: &[&Client], sub: &str, n: usize) -> (usize, usize) {
    let c = clients[0];
    let started = std::time::Instant::now();
    let answers = c.block_on(async {
        let all = (0..n).map(|i| {
            let body = json!({"query": "add_note", "params": [format!("{sub} {i}")],
                              "identity": who(sub)});
            let client = clients[i % clients.len()];
            async move { client.post("/v1/execute", &body).await }
        });
        futures::future::join_all(all).await
    });
    let mut admitted = 0;
    for a in &answers {
        match a.status {
            200 => admitted += 1,
            429 => {
                assert_eq!(a.code(), "rate_limited", "{}", a.body);
                let retry: u64 = a.headers["retry-after"]
                    .to_str()
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .expect("Retry-After in seconds");
                assert!((1..=2).contains(&retry), "retry after {retry}");
            }
            other => panic!("{other}: {}", a.body),
        }
    }
    let bound = BURST as usize + started.elapsed().as_secs() as usize + 1;
    (admitted, bound)
}

#[test]
fn one_user_cannot_crowd_out_another() {
    let stack = stack();
    let c = &stack.client;
    let (admitted, bound) = flood(&[c], "mallory", 30);
    assert!(
        (BURST as usize..=bound).contains(&admitted),
        "{admitted} of 30 admitted (at most {bound})"
    );
    assert_eq!(
        notes_by(&stack, "mallory"),
        admitted as i64,
        "nothing refused ran"
    );
    // Bob, right after: his own bucket, full.
    assert_eq!(flood(&[c], "bob", BURST as usize).0, BURST as usize);
    // Reads count too, cached or not: Mallory's bucket is still about empty.
    let reads = c.block_on(futures::future::join_all((0..BURST).map(|_| {
        c.query_async(json!({"query": "my_notes", "identity": who("mallory")}))
    })));
    assert!(
        reads.iter().any(|r| r.status == 429),
        "reads are limited too"
    );
    // A caller without an identity is not limited by it.
    for _ in 0..20 {
        assert_eq!(c.query(json!({"sql": "SELECT 1 AS one"})).status, 200);
    }
    // One bucket per user in Redis, and nothing else of the limiter's.
    let mut r = stack.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("ferry:rl:*")
        .query(&mut r)
        .expect("keys");
    assert_eq!(keys.len(), 2, "{keys:?}");
}

/// Two sidecar binaries on one Redis and Postgres, configured as in production (the sample
/// config and environment overrides): a user's requests spread over both share one bucket.
#[test]
fn two_sidecars_share_one_count() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let burst = BURST.to_string();
    let env = [
        ("FERRY_CONFIG", sample),
        ("FERRY_IDENTITY_RATE_PER_S", "1"),
        ("FERRY_IDENTITY_BURST", burst.as_str()),
    ];
    let start = || SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null());
    let (one, two) = (start(), start());
    let (admitted, bound) = flood(&[&one.client, &two.client], "carol", 30);
    assert!(
        (BURST as usize..=bound).contains(&admitted),
        "{admitted} of 30 admitted across two sidecars (at most {bound})"
    );
    let landed: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM notes WHERE owner = 'carol'", &[])
        .expect("count")
        .get(0);
    assert_eq!(landed, admitted as i64);
}

#[test]
fn redis_down_keeps_each_user_to_the_rate_in_each_sidecar() {
    let mut stack = stack();
    let c = &stack.client;
    stack.redis.kill();
    let started = std::time::Instant::now();
    let read = |sub: &str| {
        c.query(json!({"query": "my_notes", "identity": who(sub), "cache": {"ttl_s": 5}}))
    };
    let mut admitted = 0;
    for i in 0..(BURST * 3) {
        let a = read("dave");
        match a.status {
            200 => admitted += 1,
            429 => assert_eq!(a.code(), "rate_limited", "{}", a.body),
            s => panic!("read {i} with Redis down answered {s}: {}", a.body),
        }
    }
    // The burst, plus one a second for as long as the flood took.
    let most = BURST as usize + 1 + started.elapsed().as_secs() as usize;
    assert!(
        (BURST as usize..=most).contains(&admitted),
        "{admitted} of {} admitted with Redis down (the burst is {BURST}, at most {most})",
        BURST * 3
    );
    // Another user is not slowed by dave.
    assert_eq!(read("erin").status, 200);
}

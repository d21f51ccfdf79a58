//! Redis ending the sidecar's connections while it stays up: `CLIENT KILL` (an operator), or a
//! hosted Redis's idle `timeout`, which closes clients that sat idle; or the network in between
//! aborting them (a NAT or load balancer's TCP RST: "connection reset", not an orderly end).
//! Redis is up, so nothing
//! may fail or fall back: right after every connection was ended, a cached read is still a
//! hit (not `bypass`: a closed connection is not Redis down), a cache command answers, and a
//! write's invalidation is `done`. On the binary, with both a worker's multiplexed connection
//! and the pooled ones in use; Redis's own `CLIENT LIST` judges that the connections ended.
use ferry_testkit::{CutProxy, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

/// A request of one kind, for round `n`: what it answered wrong, if anything.
type Check<'a> = Box<dyn Fn(i64) -> Option<String> + 'a>;

/// The Upstash-compatible route's bearer token (`[upstash]` is on in these sidecars).
const UPSTASH_TOKEN: &str = "clients-killed-upstash-token-0123456789abcdef";

fn checks<'a>(s: &'a SidecarProcess, written: &'a AtomicU64) -> Vec<(&'static str, Check<'a>)> {
    let c = &s.client;
    let read = json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 600}});
    let upstash = format!("http://127.0.0.1:{}/", s.port);
    let upstash = move |cmd: serde_json::Value| {
        c.block_on(async {
            let r = reqwest::Client::new()
                .post(&upstash)
                .bearer_auth(UPSTASH_TOKEN)
                .body(cmd.to_string())
                .send()
                .await
                .expect("send to the upstash route");
            let status = r.status().as_u16();
            (
                status,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        })
    };
    vec![
        (
            // Another protocol on the same connections: Upstash's Redis REST, as its
            // clients speak it. A read first (it meets the ended connection and goes again on
            // a fresh one), then a write and a read.
            "upstash get, set, get",
            Box::new(move |_| {
                let first = upstash(json!(["GET", "up"]));
                if first.0 != 200 || ![json!(null), json!("u")].contains(&first.1["result"]) {
                    return Some(format!("first get: {first:?}"));
                }
                let set = upstash(json!(["SET", "up", "u"]));
                if set != (200, json!({"result": "OK"})) {
                    return Some(format!("set: {set:?}"));
                }
                let get = upstash(json!(["GET", "up"]));
                (get != (200, json!({"result": "u"}))).then(|| format!("get: {get:?}"))
            }),
        ),
        (
            "cached read",
            Box::new(move |_| {
                let a = c.query(read.clone());
                (a.status != 200 || a.body["cache"] != "hit").then(|| format!("{:?}", a.body))
            }),
        ),
        (
            "cache get",
            Box::new(move |_| {
                let a = c.cache(json!({"op": "get", "key": "kept"}));
                (a.status != 200 || a.body["value"] != "v").then(|| format!("{:?}", a.body))
            }),
        ),
        (
            "cache set",
            Box::new(move |n| {
                let a = c.cache(json!({"op": "set", "key": format!("k{n}"), "value": "x"}));
                (a.status != 200).then(|| format!("{:?}", a.body))
            }),
        ),
        (
            // A write to a row whose entry is cached, acknowledged `done`: the next read is
            // the new row, never the entry from before (Postgres's row is what was written).
            "write, invalidate, read back",
            Box::new(move |n| {
                let id = 200 + n;
                let name = format!("v{}", written.fetch_add(1, Ordering::Relaxed));
                let key = format!("items:{id}");
                let a = c.execute(json!({
                    "sql": "UPDATE items SET name = $2 WHERE id = $1", "params": [id, name],
                    "invalidate": {"keys": [key]},
                }));
                if a.status != 200 || a.body["invalidation"] != "done" {
                    return Some(format!("write: {:?}", a.body));
                }
                let read = json!({"sql": "SELECT name FROM items WHERE id = $1", "params": [id],
                                  "cache": {"ttl_s": 600, "key": key}});
                for _ in 0..2 {
                    let r = c.query(read.clone());
                    if r.status != 200 || r.body["rows"][0]["name"] != name.as_str() {
                        return Some(format!("read after the write of {name}: {:?}", r.body));
                    }
                }
                None
            }),
        ),
    ]
}

/// The sidecar's connections, as Redis lists them (every client but the judge's own).
fn sidecar_clients(judge: &mut redis::Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(judge)
        .expect("CLIENT LIST");
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query(judge)
        .expect("CLIENT ID");
    list.lines()
        .filter(|l| !l.starts_with(&format!("id={me} ")))
        .map(|l| l.split(' ').next().unwrap_or_default().to_string())
        .collect()
}

/// Ends every connection but the judge's: normal clients, and the one that listens for other
/// sidecars' fills.
fn kill_all(judge: &mut redis::Connection) {
    for kind in ["normal", "pubsub"] {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg(kind)
            .arg("SKIPME")
            .arg("yes")
            .query(judge)
            .expect("CLIENT KILL");
    }
}

/// How every connection is ended.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `CLIENT KILL`: Redis closes them.
    Killed,
    /// The proxy in between aborts each with a TCP RST.
    Reset,
}

/// Each worker's multiplexed connection, and pooled ones.
#[test]
fn every_cache_request_succeeds_right_after_redis_ends_the_sidecars_connections() {
    killed_under_every_request("4", "multiplexed and pooled", Ending::Killed);
}

/// A pool of one Redis connection leaves the workers none: every command pooled.
#[test]
fn every_cache_request_succeeds_right_after_redis_ends_the_pooled_connection() {
    killed_under_every_request("1", "pooled", Ending::Killed);
}

/// The network in between resets every connection (both shapes).
#[test]
fn every_cache_request_succeeds_right_after_the_network_resets_the_sidecars_connections() {
    killed_under_every_request("4", "multiplexed and pooled", Ending::Reset);
    killed_under_every_request("1", "pooled", Ending::Reset);
}

fn killed_under_every_request(pool: &str, label: &str, ending: Ending) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], redis.port)));
    let redis_url = match ending {
        Ending::Killed => redis.url(),
        Ending::Reset => format!("redis://{}/", proxy.addr),
    };
    let s = SidecarProcess::start(
        BIN,
        &redis_url,
        &pg.url(),
        &[
            ("FERRY_AUTH_ALLOW_RAW_SQL", "true"),
            ("FERRY_SERVER_WORKERS", "2"),
            ("FERRY_REDIS_POOL_SIZE", pool),
            ("FERRY_SERVER_READINESS_INTERVAL_MS", "3600000"),
            ("FERRY_UPSTASH_ENABLED", "true"),
            ("FERRY_UPSTASH_SHARE_CACHE_REDIS", "true"),
            ("FERRY_UPSTASH_TOKEN", UPSTASH_TOKEN),
        ],
        Stdio::null(),
    );
    let end_all = |judge: &mut redis::Connection| match ending {
        Ending::Killed => kill_all(judge),
        Ending::Reset => proxy.reset(),
    };
    let c = &s.client;
    assert_eq!(
        c.cache(json!({"op": "set", "key": "kept", "value": "v"}))
            .status,
        200
    );
    let written = AtomicU64::new(0);
    let checks = checks(&s, &written);
    let judge = &mut redis.conn();
    let mut wrong = Vec::new();
    let (mut counted, mut incr_refused) = (0, 0);
    for n in 1..=4i64 {
        for (what, check) in &checks {
            // Connections open wherever this kind of request takes them from (a miss first:
            // the entry is there for the hit).
            c.query(json!({"sql": "SELECT name FROM items WHERE id = 1", "cache": {"ttl_s": 600}}));
            ferry_testkit::wait_until(what, Duration::from_secs(10), || {
                (0..4).all(|_| check(n).is_none())
            });
            let before = sidecar_clients(judge);
            assert!(!before.is_empty(), "the sidecar holds no connection");
            end_all(judge);
            // (Redis learns of a reset one when the proxy closes its side.)
            ferry_testkit::wait_until("the connections to end", Duration::from_secs(5), || {
                let after = sidecar_clients(judge);
                before.iter().all(|id| !after.contains(id))
            });
            std::thread::sleep(Duration::from_millis(20));
            if let Some(e) = check(n) {
                wrong.push(format!("round {n}, {what}: {e}"));
            }
        }
        // An INCR must not run twice, so one that meets an ended connection is not sent again:
        // it may fail (503, at once), the next one may not, and Redis's count is the count of
        // the answered ones.
        end_all(judge);
        std::thread::sleep(Duration::from_millis(20));
        for i in 0..2 {
            let a = c.cache(json!({"op": "incr", "key": "counted"}));
            match a.status {
                200 => counted += 1,
                503 if i == 0 => incr_refused += 1,
                _ => wrong.push(format!("round {n}, incr {i}: {:?}", a.body)),
            }
        }
    }
    let value = c.cache(json!({"op": "get", "key": "counted"}));
    assert_eq!(
        value.body["value"],
        counted.to_string(),
        "answered INCRs: {counted}"
    );
    println!(
        "FIGURES redis clients ended ({ending:?}, {label}): {} requests, each right after Redis ended every sidecar \
         connection; {} wrong; INCR right after: {incr_refused} of 4 refused (503), Redis counts \
         {counted}, the answered ones",
        4 * checks.len(),
        wrong.len()
    );
    assert!(wrong.is_empty(), "with Redis up: {wrong:#?}");
}

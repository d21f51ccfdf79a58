//! The holder of a captured signed request replays it to another sidecar behind the same
//! balancer: three sidecar binaries share one Redis and one Postgres. A request accepted by one
//! is refused as a replay by every other, reads and writes alike. With Redis down, a replayed
//! write is still refused (its nonce is recorded in Postgres, in the write's round trip), and
//! reads are still served. Postgres's rows judge what ran.
use ferry_testkit::client::{nonce, now_s};
use ferry_testkit::{Client, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn setup() -> (RedisServer, PgServer, Vec<SidecarProcess>) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute("CREATE TABLE replay_writes (n serial PRIMARY KEY, note text NOT NULL)")
        .expect("table");
    let sidecars = (0..3)
        .map(|_| SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null()))
        .collect();
    (redis, pg, sidecars)
}

fn writes(pg: &PgServer, note: &str) -> i64 {
    pg.client()
        .query_one(
            "SELECT count(*) FROM replay_writes WHERE note = $1",
            &[&note],
        )
        .expect("count")
        .get(0)
}

/// One signed request, then the very same bytes and headers to every other sidecar at once.
/// Returns the first answer's status and the replays' (status, code).
fn send_then_replay(
    first: &Client,
    others: &[&Client],
    path: &str,
    body: &serde_json::Value,
) -> (u16, Vec<(u16, String)>) {
    let body = serde_json::to_vec(body).expect("json");
    let h = first.headers_for("POST", path, &body, now_s(), &nonce());
    first.block_on(async {
        let a = first.send_raw("POST", path, body.clone(), &h).await;
        assert!(a.status == 200, "the original is served: {}", a.body);
        let replays = others
            .iter()
            .map(|c| c.send_raw("POST", path, body.clone(), &h));
        let replays = futures::future::join_all(replays).await;
        (
            a.status,
            replays
                .iter()
                .map(|r| (r.status, r.code().to_string()))
                .collect(),
        )
    })
}

fn insert(note: &str) -> serde_json::Value {
    json!({"sql": "INSERT INTO replay_writes (note) VALUES ($1)", "params": [note]})
}

#[test]
fn a_request_accepted_by_one_sidecar_is_refused_by_every_other() {
    let (redis, pg, s) = setup();
    let refused = |replays: &[(u16, String)]| {
        replays
            .iter()
            .all(|(status, code)| *status == 401 && code == "auth_replayed")
    };
    for i in 0..20 {
        let (first, others) = (
            &s[i % 3].client,
            [&s[(i + 1) % 3].client, &s[(i + 2) % 3].client],
        );
        // A write: it must run once, whichever sidecar the replay reaches.
        let note = format!("write {i}");
        let (_, replays) = send_then_replay(first, &others, "/v1/execute", &insert(&note));
        assert!(refused(&replays), "write replay {i}: {replays:?}");
        assert_eq!(writes(&pg, &note), 1, "the write ran once");
        // A read and a transaction: refused as well.
        let read = json!({"sql": "SELECT name FROM items WHERE id = 1",
                          "cache": {"ttl_s": 60, "key": "one"}});
        let (_, replays) = send_then_replay(first, &others, "/v1/query", &read);
        assert!(refused(&replays), "read replay {i}: {replays:?}");
        let note = format!("tx {i}");
        let tx = json!({"statements": [insert(&note)]});
        let (_, replays) = send_then_replay(first, &others, "/v1/transaction", &tx);
        assert!(refused(&replays), "transaction replay {i}: {replays:?}");
        assert_eq!(writes(&pg, &note), 1, "the transaction ran once");
        // Cache commands: a write to Redis (INCR, which a replay would count twice), a read,
        // and a batch of reads.
        let key = format!("hits{i}");
        let incr = json!({"op": "incr", "key": key});
        let (_, replays) = send_then_replay(first, &others, "/v1/cache", &incr);
        assert!(refused(&replays), "cache incr replay {i}: {replays:?}");
        let get = json!({"op": "get", "key": key});
        let (_, replays) = send_then_replay(first, &others, "/v1/cache", &get);
        assert!(refused(&replays), "cache get replay {i}: {replays:?}");
        let batch = json!({"reads": [{"sql": "SELECT 1 AS one"}]});
        let (_, replays) = send_then_replay(first, &others, "/v1/batch", &batch);
        assert!(refused(&replays), "batch replay {i}: {replays:?}");
    }
    // Redis's own count judges the INCRs: each ran once.
    let mut conn = redis::Client::open(redis.url().as_str())
        .and_then(|c| c.get_connection())
        .expect("redis");
    for i in 0..20 {
        let n: Vec<u8> = redis::cmd("KEYS")
            .arg(format!("*hits{i}"))
            .query::<Vec<String>>(&mut conn)
            .expect("keys")
            .first()
            .map(|k| {
                redis::cmd("GET")
                    .arg(k)
                    .query::<Vec<u8>>(&mut conn)
                    .expect("get")
            })
            .expect("the counter exists");
        assert_eq!(n, b"1", "hits{i} was incremented once");
    }
}

#[test]
fn with_redis_down_a_replayed_write_is_still_refused_and_reads_are_served() {
    let (mut redis, pg, s) = setup();
    let (a, b, c) = (&s[0].client, &s[1].client, &s[2].client);
    // Accepted while Redis was up, replayed once it is gone: Redis's record of the nonce is
    // out of reach, Postgres's is not.
    let body = serde_json::to_vec(&insert("before")).expect("json");
    let h = a.headers_for("POST", "/v1/execute", &body, now_s(), &nonce());
    assert_eq!(a.raw("POST", "/v1/execute", body.clone(), &h).status, 200);
    redis.kill();
    let replay = b.raw("POST", "/v1/execute", body, &h);
    assert_eq!(
        (replay.status, replay.code()),
        (401, "auth_replayed"),
        "{}",
        replay.body
    );
    assert_eq!(writes(&pg, "before"), 1);

    // Accepted and replayed while Redis is down: writes and transactions.
    for i in 0..5 {
        let note = format!("down {i}");
        let (_, replays) = send_then_replay(a, &[b, c], "/v1/execute", &insert(&note));
        assert!(
            replays
                .iter()
                .all(|(st, code)| *st == 401 && code == "auth_replayed"),
            "{replays:?}"
        );
        assert_eq!(writes(&pg, &note), 1, "the write ran once");
        let note = format!("down tx {i}");
        let tx = json!({"statements": [insert(&note)]});
        let (_, replays) = send_then_replay(a, &[b, c], "/v1/transaction", &tx);
        assert!(
            replays
                .iter()
                .all(|(st, code)| *st == 401 && code == "auth_replayed"),
            "{replays:?}"
        );
        assert_eq!(writes(&pg, &note), 1, "the transaction ran once");
    }

    // Reads keep being served from Postgres (Redis down never fails a read Postgres can
    // serve); a replayed read is refused by the sidecar that saw it, and may be answered by
    // another during the outage: it changes nothing (RELIABILITY.md).
    let read = json!({"sql": "SELECT name FROM items WHERE id = 1"});
    let body = serde_json::to_vec(&read).expect("json");
    let h = a.headers_for("POST", "/v1/query", &body, now_s(), &nonce());
    assert_eq!(a.raw("POST", "/v1/query", body.clone(), &h).status, 200);
    assert_eq!(a.raw("POST", "/v1/query", body, &h).code(), "auth_replayed");
    assert_eq!(a.query(read).status, 200);
}

/// A read's replay check rides in the same Redis pipeline as the read's own command. An
/// outside writer turns the caller's key into a list, so Redis refuses the GET itself: the
/// original still gets the GET's own answer (400, not a replay), and its replay to another
/// sidecar is still refused, so the refused command did not take the check's verdict with it.
#[test]
fn a_replay_is_refused_even_when_redis_refuses_the_read() {
    let (redis, _pg, s) = setup();
    let (a, b) = (&s[0].client, &s[1].client);
    let mut conn = redis::Client::open(redis.url().as_str())
        .and_then(|c| c.get_connection())
        .expect("redis");
    for (i, op) in ["get", "mget"].iter().enumerate() {
        let key = format!("listy{i}");
        let _: i64 = redis::cmd("RPUSH")
            .arg(format!("ferry:k:{key}"))
            .arg("x")
            .query(&mut conn)
            .expect("rpush");
        let cmd = if *op == "get" {
            json!({"op": "get", "key": key})
        } else {
            json!({"op": "mget", "keys": [key, "other"]})
        };
        let body = serde_json::to_vec(&cmd).expect("json");
        let h = a.headers_for("POST", "/v1/cache", &body, now_s(), &nonce());
        let first = a.raw("POST", "/v1/cache", body.clone(), &h);
        let replay = b.raw("POST", "/v1/cache", body, &h);
        println!(
            "{op} on a list: first {} {}, replay {} {}",
            first.status,
            first.code(),
            replay.status,
            replay.code()
        );
        assert_ne!(first.code(), "auth_replayed", "{op}: {}", first.body);
        assert_eq!(
            (replay.status, replay.code()),
            (401, "auth_replayed"),
            "{op}: {}",
            replay.body
        );
    }
}

//! The hostile (or careless) caller against the sidecar's bounds, on the binary with a Postgres
//! pool of one: oversized results are stopped as they arrive, a batch has one deadline and one
//! byte budget, invalidations are capped, and invalidations waiting for a stopped Redis are
//! bounded without ever being dropped.
use ferry_testkit::{client::Answer, wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn start(env: &[(&str, &str)]) -> (RedisServer, PgServer, SidecarProcess) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let mut all = vec![
        ("FERRY_POSTGRES_POOL_SIZE", "1"),
        ("FERRY_SERVER_READINESS_INTERVAL_MS", "100"),
    ];
    all.extend_from_slice(env);
    let sidecar = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &all, Stdio::null());
    (redis, pg, sidecar)
}

/// Postgres's own view of the row a refused write would have changed.
fn item_1_name(pg: &PgServer) -> String {
    pg.client()
        .query_one("SELECT name FROM items WHERE id = 1", &[])
        .expect("row")
        .get(0)
}

fn peak_rss_mb(pid: u32) -> u64 {
    ferry_testkit::peak_rss_kb(pid) / 1024
}

fn too_large(a: &Answer, limit: &str) {
    assert_eq!(a.status, 422, "{:?}", a.body);
    assert_eq!(a.code(), "result_too_large", "{:?}", a.body);
    let message = a.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(limit), "names {limit}: {message}");
}

#[test]
fn oversized_results_are_stopped_as_they_arrive() {
    let (_redis, pg, s) = start(&[]);
    let c = &s.client;
    // 400 rows of 1 MB: 400 MB if buffered.
    let start = Instant::now();
    let big =
        c.query(json!({"sql": "SELECT repeat('x', 1048576) AS v FROM generate_series(1, 400)"}));
    too_large(&big, "limits.max_read_bytes");
    println!(
        "FIGURES 400 x 1 MB refused in {:?}; sidecar peak RSS {} MB",
        start.elapsed(),
        peak_rss_mb(s.pid())
    );
    assert!(
        peak_rss_mb(s.pid()) < 64,
        "peak RSS {} MB",
        peak_rss_mb(s.pid())
    );
    too_large(
        &c.query(json!({"sql": "SELECT g FROM generate_series(1, 20000) AS g"})),
        "limits.max_read_rows",
    );
    // The one pooled connection was replaced, not left streaming: the next read works, and
    // Postgres shows no backend still sending the abandoned result.
    let next = c.query(json!({"sql": "SELECT count(*)::int AS n FROM items"}));
    assert_eq!(next.body["rows"][0]["n"], 1000, "{:?}", next.body);
    wait_until(
        "the abandoned backend to go",
        Duration::from_secs(5),
        || {
            pg.client()
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%repeat(%' \
                 AND state = 'active' AND pid <> pg_backend_pid()",
                    &[],
                )
                .map(|r| r.get::<_, i64>(0) == 0)
                .unwrap_or(false)
        },
    );
}

#[test]
fn a_batch_has_one_deadline_and_one_byte_budget() {
    let (_redis, _pg, s) = start(&[
        ("FERRY_SERVER_REQUEST_TIMEOUT_MS", "1500"),
        ("FERRY_LIMITS_MAX_BATCH_BYTES", "100000"),
    ]);
    let c = &s.client;
    // 20 reads of 0.5 s on one connection: 10 s if each had only its own deadline.
    let reads: Vec<_> = (0..20)
        .map(|i| json!({"sql": format!("SELECT pg_sleep(0.5)::text AS s, {i} AS i")}))
        .collect();
    let start = Instant::now();
    let slow = c.block_on(c.post("/v1/batch", &json!({ "reads": reads })));
    let took = start.elapsed();
    assert_eq!(slow.status, 504, "{:?}", slow.body);
    assert_eq!(slow.code(), "timeout");
    assert!(
        took < Duration::from_secs(4),
        "the batch's deadline: {took:?}"
    );

    // Ten reads of 30 KB against a 100 KB budget: the first ones answer, the rest are refused.
    let reads: Vec<_> = (0..10)
        .map(|i| json!({"sql": format!("SELECT repeat('y', 30000) AS v, {i} AS i")}))
        .collect();
    let b = c.block_on(c.post("/v1/batch", &json!({ "reads": reads })));
    assert_eq!(b.status, 200, "{:?}", b.body);
    let results = b.body["results"].as_array().expect("results");
    let ok = results.iter().filter(|r| r["ok"].is_object()).count();
    assert_eq!(ok, 3, "{} KB of 100", ok * 30);
    assert!(results[3..]
        .iter()
        .all(|r| r["error"]["code"] == "result_too_large"));
}

#[test]
fn invalidations_are_capped_and_nothing_runs_past_the_cap() {
    let (_redis, pg, s) = start(&[("FERRY_LIMITS_MAX_INVALIDATE_KEYS", "10")]);
    let keys: Vec<String> = (0..11).map(|i| format!("k{i}")).collect();
    let a = s.client.execute(json!({
        "sql": "UPDATE items SET name = 'capped' WHERE id = 1",
        "invalidate": {"keys": keys}
    }));
    assert_eq!(a.status, 400, "{:?}", a.body);
    assert_eq!(a.body["error"]["field"], "invalidate.keys");
    let name = item_1_name(&pg);
    assert_eq!(name, "item 1", "a refused request runs nothing");
}

#[test]
fn one_bad_item_in_a_list_is_named_and_nothing_of_the_request_runs() {
    let (redis, pg, s) = start(&[]);
    let c = &s.client;
    // The caller holds the secret and hides one bad item among good ones; each answer must
    // name the item, and Redis and Postgres must show that nothing of the request ran.
    let refused = |a: Answer, field: &str| {
        assert_eq!(a.status, 400, "{field}: {:?}", a.body);
        assert_eq!(a.code(), "invalid_value", "{field}: {:?}", a.body);
        assert_eq!(a.body["error"]["field"], field, "{:?}", a.body);
    };
    refused(
        c.cache(json!({"op": "mget", "keys": ["ok", "a\u{1}b"]})),
        "keys[1]",
    );
    refused(
        c.cache(json!({"op": "mset", "entries": [
            {"key": "first", "value": "v"},
            {"key": "k".repeat(600), "value": "v"},
        ]})),
        "entries[1].key",
    );
    let first: Option<String> = redis::cmd("GET")
        .arg("ferry:k:first")
        .query(&mut redis.conn())
        .expect("get");
    assert_eq!(first, None, "a refused mset wrote its first entry");
    refused(
        c.query(json!({"sql": "SELECT 1", "cache": {"ttl_s": 60, "tags": ["ok", ""]}})),
        "cache.tags[1]",
    );
    refused(
        c.execute(json!({
            "sql": "UPDATE items SET name = 'hidden' WHERE id = 1",
            "invalidate": {"keys": ["ok", "x\u{7f}y"]}
        })),
        "invalidate.keys[1]",
    );
    let name = item_1_name(&pg);
    assert_eq!(name, "item 1", "a refused write ran");
}

#[test]
fn invalidations_waiting_for_redis_are_bounded_and_never_dropped() {
    let (redis, _pg, s) = start(&[
        ("FERRY_LIMITS_MAX_PENDING_INVALIDATIONS", "5"),
        ("FERRY_REDIS_IO_TIMEOUT_MS", "200"),
        ("FERRY_REDIS_CHECKOUT_TIMEOUT_MS", "200"),
        ("FERRY_REDIS_RETRY_AFTER_FAILURE_MS", "200"),
        ("FERRY_CACHE_INVALIDATION_RETRY_MS", "100"),
    ]);
    let c = &s.client;
    let read = |id: i32| {
        c.query(json!({
            "sql": "SELECT name FROM items WHERE id = $1",
            "params": [id],
            "cache": {"ttl_s": 300, "key": format!("it:{id}")}
        }))
    };
    for id in 1..=8 {
        assert_eq!(read(id).body["cache"], "miss");
        assert_eq!(read(id).body["cache"], "hit");
    }
    // Redis stops answering but keeps its data (the cached rows are still in it).
    redis.pause();
    for id in 1..=8 {
        let w = c.execute(json!({
            "sql": "UPDATE items SET name = $1 WHERE id = $2",
            "params": [format!("new {id}"), id],
            "invalidate": {"keys": [format!("it:{id}")]}
        }));
        assert_eq!(w.status, 200, "{:?}", w.body);
        assert_eq!(w.body["invalidation"], "deferred");
    }
    // Past the bound of 5: one whole-cache invalidation waits, and the sidecar says so.
    let ready = c.get("/readyz");
    assert_eq!(ready.body["pending_invalidations"], 1, "{:?}", ready.body);
    assert_eq!(ready.body["cache_bypassed"], true);
    let metrics = c.block_on(async {
        reqwest::get(format!("http://127.0.0.1:{}/metrics", s.admin_port))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    });
    assert!(metrics.contains("ferry_cache_bypassed 1"), "{metrics}");
    for id in 1..=8 {
        let r = read(id);
        assert_eq!(r.body["cache"], "bypass");
        assert_eq!(r.body["rows"][0]["name"], format!("new {id}"));
    }
    redis.resume();
    wait_until(
        "the deferred invalidation to land",
        Duration::from_secs(10),
        || c.get("/readyz").body["cache_bypassed"] == false,
    );
    // Connections broken by the pause are replaced on first use: wait until reads use Redis.
    wait_until("reads to use redis again", Duration::from_secs(10), || {
        read(100).body["cache"] != "bypass"
    });
    // Every entry from before is invalid now: fresh rows, then cached again.
    for id in 1..=8 {
        let r = read(id);
        assert_eq!(
            r.body["rows"][0]["name"],
            format!("new {id}"),
            "{:?}",
            r.body
        );
        assert_eq!(r.body["cache"], "miss");
        assert_eq!(read(id).body["cache"], "hit");
    }
}

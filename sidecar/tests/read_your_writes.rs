//! Read-your-writes against a lagging streaming replica. The sidecar binary reads from a real
//! hot standby (`pg_basebackup -R`) that holds every commit back (`recovery_min_apply_delay`);
//! each write returns its position, and the read that carries it must never see the row as it
//! was before the write, whichever server answers. The replica's own statistics say it served
//! reads; the rows judge the rest.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TASKS: u64 = 16;
const IDS_PER_TASK: u64 = 4;
const PAIRS: u64 = 10_000;

/// A primary (commits flushed at once, as in production, so they stream without the WAL
/// writer's delay) with the test table, and a replica of it started with `replica_extra`.
fn primary_and_replica(replica_extra: &str) -> (PgServer, PgServer) {
    let primary = PgServer::start_with("-c synchronous_commit=on");
    primary
        .client()
        .batch_execute(&format!(
            "CREATE TABLE ryw (id int PRIMARY KEY, v bigint NOT NULL);
             INSERT INTO ryw SELECT g, 0 FROM generate_series(0, {}) g;",
            TASKS * IDS_PER_TASK - 1
        ))
        .expect("create the table");
    let replica = PgServer::replica_of(&primary, replica_extra);
    (primary, replica)
}

fn sidecar(
    redis: &RedisServer,
    primary: &PgServer,
    replica: &PgServer,
    env: &[(&str, &str)],
) -> SidecarProcess {
    let url = replica.url();
    let mut all = vec![
        ("FERRY_REPLICAS_URLS", url.as_str()),
        ("FERRY_REPLICAS_POLL_MS", "20"),
        ("FERRY_SERVER_MAX_IN_FLIGHT", "256"),
    ];
    all.extend_from_slice(env);
    SidecarProcess::start(BIN, &redis.url(), &primary.url(), &all, Stdio::null())
}

/// Index scans of `ryw` this server ran: its own view of who served the reads.
fn scans(pg: &PgServer) -> i64 {
    pg.client()
        .query_one(
            "SELECT COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'ryw'",
            &[],
        )
        .expect("table statistics")
        .get(0)
}

#[test]
fn ten_thousand_writes_are_each_read_back_through_a_lagging_replica() {
    let redis = RedisServer::start();
    let (primary, replica) = primary_and_replica("-c recovery_min_apply_delay=100ms");
    let s = sidecar(
        &redis,
        &primary,
        &replica,
        &[("FERRY_REPLICAS_MAX_LAG_MS", "5000")],
    );
    // A second sidecar: half the reads go there, carrying positions the first one returned.
    let other = sidecar(
        &redis,
        &primary,
        &replica,
        &[("FERRY_REPLICAS_MAX_LAG_MS", "5000")],
    );
    for x in [&s, &other] {
        ferry_testkit::wait_until("the replica in use", Duration::from_secs(10), || {
            x.metric("ferry_replica_in_use{replica=\"0\"}") == Some(1.0)
        });
    }
    let replica_scans_before = scans(&replica);
    let violations = Arc::new(AtomicU64::new(0));
    let client = s.client.clone();
    let reader_elsewhere = other.client.clone();
    client.block_on(async {
        let tasks = (0..TASKS).map(|t| {
            let (c, violations) = (client.clone(), violations.clone());
            let reads = if t % 2 == 0 {
                c.clone()
            } else {
                reader_elsewhere.clone()
            };
            async move {
                let mut written = [0u64; IDS_PER_TASK as usize];
                for i in 0..PAIRS / TASKS {
                    let slot = (i % IDS_PER_TASK) as usize;
                    let id = t * IDS_PER_TASK + slot as u64;
                    written[slot] += 1;
                    let w = c
                        .post(
                            "/v1/execute",
                            &json!({"sql": "UPDATE ryw SET v = $2 WHERE id = $1",
                                    "params": [id, written[slot]]}),
                        )
                        .await;
                    assert_eq!(w.status, 200, "{:?}", w.body);
                    let position = w.body["position"].clone();
                    assert!(
                        position.is_string(),
                        "a write returns its position: {:?}",
                        w.body
                    );
                    // Now and then, give the replica time to pass the write (it holds each
                    // commit back 100 ms): those reads go to the replica.
                    if i % 8 == 7 {
                        let ms = (i * 37 + t * 11) % 300;
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    let r = reads
                        .query_async(json!({"sql": "SELECT v FROM ryw WHERE id = $1",
                                            "params": [id], "after": position}))
                        .await;
                    assert_eq!(r.status, 200, "{:?}", r.body);
                    let v = r.body["rows"][0]["v"].as_u64().expect("v");
                    if v < written[slot] {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        futures::future::join_all(tasks).await;
    });
    let on_replica = [&s, &other]
        .iter()
        .map(|x| {
            x.metric("ferry_replica_reads_total{replica=\"0\"}")
                .expect("reads")
        })
        .sum::<f64>();
    let fallbacks_other = other.metric("ferry_replica_fallbacks_total");
    drop(other);
    let mut s = s;
    let fallbacks = s.metric("ferry_replica_fallbacks_total");
    // Postgres counts a backend's scans when it goes idle for a while or ends: end them.
    s.terminate();
    ferry_testkit::wait_until("the replica's statistics", Duration::from_secs(15), || {
        (scans(&replica) - replica_scans_before) as f64 >= on_replica
    });
    let replica_scans = scans(&replica) - replica_scans_before;
    eprintln!(
        "{PAIRS} pairs: {} violations; {on_replica} reads served by the replica \
         ({replica_scans} index scans there)",
        violations.load(Ordering::Relaxed)
    );
    assert_eq!(
        violations.load(Ordering::Relaxed),
        0,
        "a read missed its own write"
    );
    assert!(on_replica >= 100.0, "the replica served {on_replica} reads");
    // Every other read went to the primary, and none is lost.
    assert_eq!((fallbacks, fallbacks_other), (Some(0.0), Some(0.0)));
}

fn read(s: &SidecarProcess, after: Option<&Value>) -> ferry_testkit::client::Answer {
    let mut body = json!({"sql": "SELECT v FROM ryw WHERE id = 0"});
    if let Some(a) = after {
        body["after"] = a.clone();
    }
    s.client.query(body)
}

#[test]
fn a_lagging_or_dead_replica_is_taken_out_and_put_back() {
    let redis = RedisServer::start();
    let (primary, mut replica) = primary_and_replica("");
    // `any`: reads without a position go to the replica too, so only the lag bound keeps
    // them fresh.
    let s = sidecar(
        &redis,
        &primary,
        &replica,
        &[
            ("FERRY_REPLICAS_MAX_LAG_MS", "300"),
            // Checked every 250 ms: a replica that dies is still picked for a while, so reads
            // meet it dead and must be handed to the primary.
            ("FERRY_REPLICAS_POLL_MS", "250"),
            ("FERRY_REPLICAS_READS", "any"),
        ],
    );
    let in_use = || s.metric("ferry_replica_in_use{replica=\"0\"}");
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        ferry_testkit::wait_until(what, Duration::from_secs(15), f)
    };
    wait("the replica in use", &|| in_use() == Some(1.0));
    let before = s
        .metric("ferry_replica_reads_total{replica=\"0\"}")
        .expect("reads");
    assert_eq!(read(&s, None).status, 200);
    let after = s
        .metric("ferry_replica_reads_total{replica=\"0\"}")
        .expect("reads");
    assert_eq!(
        after,
        before + 1.0,
        "with `any`, a read without position goes to the replica"
    );

    // Every way to commit returns a position; a malformed one is refused before any I/O.
    let tx = s.client.block_on(s.client.post(
        "/v1/transaction",
        &json!({"statements": [{"sql": "UPDATE ryw SET v = v WHERE id = 1"}]}),
    ));
    assert!(tx.body["position"].is_string(), "{:?}", tx.body);
    let begun = s
        .client
        .block_on(s.client.post("/v1/transaction/begin", &json!({})));
    let id = begun.body["id"].clone();
    let done = s
        .client
        .block_on(s.client.post("/v1/transaction/commit", &json!({"id": id})));
    assert!(done.body["position"].is_string(), "{:?}", done.body);
    for bad in [
        json!("nope"),
        json!(12),
        json!("1/2/3"),
        json!("123456789/0"),
    ] {
        let r = read(&s, Some(&bad));
        assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
        assert_eq!(r.body["error"]["code"], "bad_request", "{:?}", r.body);
        assert_eq!(r.body["error"]["field"], "after", "{:?}", r.body);
    }

    // Lagging: commits held back 3 s, past the 300 ms bound once writes go on.
    replica.set_apply_delay("3s");
    let write = |n: u64| {
        let w = s
            .client
            .execute(json!({"sql": "UPDATE ryw SET v = $1 WHERE id = 0", "params": [n]}));
        assert_eq!(w.status, 200, "{:?}", w.body);
    };
    let n = std::cell::Cell::new(0u64);
    wait("the lagging replica out of use", &|| {
        n.set(n.get() + 1);
        write(n.get());
        in_use() == Some(0.0)
    });
    for _ in 0..20 {
        n.set(n.get() + 1);
        write(n.get());
        let r = read(&s, None);
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(
            r.body["rows"][0]["v"],
            n.get(),
            "a lagging replica answered"
        );
    }
    // The lag is what the latest check saw: a check that failed (a session not had in time on
    // a loaded machine) reports 0 until the next, so writes go on until a check reports it.
    wait("the replica's lag reported past the bound", &|| {
        n.set(n.get() + 1);
        write(n.get());
        s.metric("ferry_replica_lag_seconds{replica=\"0\"}")
            .unwrap_or(0.0)
            > 0.3
    });

    // Caught up: back in use.
    replica.set_apply_delay("0");
    wait("the replica back in use", &|| in_use() == Some(1.0));

    // Down under load (`pg_ctl stop -m fast` cuts its sessions mid-read): reads in flight on it
    // go to the primary, the rest skip it, and every read is answered.
    let served_before = s
        .metric("ferry_replica_reads_total{replica=\"0\"}")
        .expect("reads");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let answers = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let mut statuses = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        statuses.push(read(&s, None).status);
                    }
                    statuses
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        replica.stop();
        std::thread::sleep(Duration::from_millis(1_000));
        stop.store(true, Ordering::Relaxed);
        readers
            .into_iter()
            .flat_map(|r| r.join().expect("reader"))
            .collect::<Vec<u16>>()
    });
    let failed = answers.iter().filter(|s| **s != 200).count();
    let on_replica = s
        .metric("ferry_replica_reads_total{replica=\"0\"}")
        .expect("reads")
        - served_before;
    eprintln!(
        "FIGURES replica stopped under 8 readers: {} reads, {failed} failed, {on_replica} on the \
         replica, {} handed to the primary",
        answers.len(),
        s.metric("ferry_replica_fallbacks_total").unwrap_or(0.0)
    );
    assert!(
        on_replica > 0.0,
        "the load reached the replica before it stopped"
    );
    assert_eq!(failed, 0, "a read failed with the replica stopping");
    wait("the dead replica seen down", &|| {
        s.metric("ferry_replica_up{replica=\"0\"}") == Some(0.0)
    });
    replica.start_again();
    wait("the restarted replica in use", &|| in_use() == Some(1.0));
}

//! Redis Cluster: the sidecar binary on a private cluster (`redis-cli --cluster create`, masters
//! with replicas). Batches spread over every master and hit; an invalidation that a master's
//! replica does not hold is not acknowledged as done; a master SIGKILLed under reads and
//! writes: no read fails, none returns a value older than an acknowledged write, hits resume
//! after the failover, and no acknowledged invalidation is lost. Redis's own view (DBSIZE,
//! KEYS, CLUSTER SLOTS) and the rows in Postgres judge.
use ferry_testkit::{PgServer, RedisCluster, SidecarProcess};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const ROWS: i64 = 100;

fn postgres() -> PgServer {
    let pg = PgServer::start();
    pg.client()
        .batch_execute(&format!(
            "CREATE TABLE items (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO items SELECT g, 0 FROM generate_series(1, {ROWS}) g;"
        ))
        .expect("create the table");
    pg
}

fn sidecar(cluster: &RedisCluster, pg: &PgServer, env: &[(&str, &str)]) -> SidecarProcess {
    let mut all = vec![
        ("FERRY_REDIS_CLUSTER", "true"),
        ("FERRY_SERVER_MAX_IN_FLIGHT", "256"),
    ];
    all.extend_from_slice(env);
    SidecarProcess::start(BIN, &cluster.urls(), &pg.url(), &all, Stdio::null())
}

fn read(id: i64) -> Value {
    json!({
        "sql": "SELECT n FROM items WHERE id = $1",
        "params": [id],
        "cache": {"key": format!("item:{id}"), "ttl_s": 300, "tags": [format!("group:{}", id % 7)]}
    })
}

fn write(id: i64, n: i64) -> Value {
    json!({
        "sql": "UPDATE items SET n = $2 WHERE id = $1",
        "params": [id, n],
        "invalidate": {"keys": [format!("item:{id}")]}
    })
}

/// The master holding key `item:<id>`'s version, found by asking each node for it.
fn master_holding(cluster: &RedisCluster, id: i64) -> usize {
    let pattern = format!("*v:item:{id}");
    (0..cluster.nodes.len())
        .find(|&i| {
            !cluster.keys_matching(i, &pattern).is_empty() && !cluster.replicas_of(i).is_empty()
        })
        .expect("a master holds the key's version")
}

#[test]
fn batches_spread_over_every_master_and_hit() {
    let cluster = RedisCluster::start(3, 1);
    let pg = postgres();
    let s = sidecar(&cluster, &pg, &[]);
    let batch = json!({"reads": (1..=ROWS).map(read).collect::<Vec<_>>()});
    let statuses = |a: &ferry_testkit::client::Answer| -> Vec<String> {
        assert_eq!(a.status, 200, "{}", a.body);
        a.body["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| r["ok"]["cache"].as_str().unwrap_or("error").to_string())
            .collect()
    };
    let first = s.client.block_on(s.client.post("/v1/batch", &batch));
    assert!(
        statuses(&first).iter().all(|c| c == "miss"),
        "{:?}",
        statuses(&first)
    );
    let second = s.client.block_on(s.client.post("/v1/batch", &batch));
    assert!(
        statuses(&second).iter().all(|c| c == "hit"),
        "{:?}",
        statuses(&second)
    );
    // Redis's own view: entries and versions live on every master, not one.
    let masters: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| !cluster.replicas_of(i).is_empty())
        .collect();
    assert_eq!(masters.len(), 3);
    for m in &masters {
        let entries = cluster.keys_matching(*m, "*q:item:*").len();
        assert!(entries >= 10, "master {m} holds only {entries} entries");
    }
    // A write invalidates across slots: key, then a tag on another slot.
    let w = s.client.execute(write(5, 1));
    assert_eq!(w.status, 200, "{}", w.body);
    assert_eq!(w.body["invalidation"], "done");
    let after = s.client.query(read(5));
    assert_eq!(
        (
            after.body["rows"][0]["n"].as_i64(),
            after.body["cache"].as_str()
        ),
        (Some(1), Some("miss"))
    );
    assert_eq!(s.client.query(read(12)).body["cache"], "hit");
    let tagged = s.client.execute(json!({
        "sql": "UPDATE items SET n = 100 WHERE id = 12",
        "invalidate": {"tags": ["group:5"]}
    }));
    assert_eq!(tagged.body["invalidation"], "done", "{}", tagged.body);
    assert_eq!(s.client.query(read(12)).body["rows"][0]["n"], 100);
    // Plain cache commands: MGET and DEL over many slots; an mset must stay in one slot.
    let mset = s.client.cache(json!({"op": "mset", "entries": [
        {"key": "{u1}:a", "value": "1"}, {"key": "{u1}:b", "value": "2"}]}));
    assert_eq!(mset.status, 200, "{}", mset.body);
    let set = s
        .client
        .cache(json!({"op": "set", "key": "other", "value": "3"}));
    assert_eq!(set.status, 200, "{}", set.body);
    let mget = s
        .client
        .cache(json!({"op": "mget", "keys": ["{u1}:a", "other", "{u1}:b", "none"]}));
    assert_eq!(
        mget.body["values"],
        json!(["1", "3", "2", null]),
        "{}",
        mget.body
    );
    let across = s.client.cache(json!({"op": "mset", "entries": [
        {"key": "a", "value": "1"}, {"key": "b", "value": "2"}]}));
    assert_eq!(across.status, 400, "{}", across.body);
    assert_eq!(across.body["error"]["field"], "entries", "{}", across.body);
    let del = s
        .client
        .cache(json!({"op": "del", "keys": ["{u1}:a", "other", "none"]}));
    assert_eq!(del.body["deleted"], 2, "{}", del.body);
}

#[test]
fn an_invalidation_its_replica_does_not_hold_is_not_acknowledged_as_done() {
    let cluster = RedisCluster::start(3, 1);
    let pg = postgres();
    let s = sidecar(&cluster, &pg, &[("FERRY_REDIS_CLUSTER_WAIT_MS", "100")]);
    assert_eq!(s.client.query(read(1)).body["cache"], "miss");
    assert_eq!(s.client.query(read(1)).body["cache"], "hit");
    let master = master_holding(&cluster, 1);
    let replica = cluster.replicas_of(master)[0];
    // The replica stops taking the master's stream: a write the master answers now would be
    // lost if the master died, since only this replica could replace it.
    cluster.nodes[replica].pause();
    let w = s.client.execute(write(1, 1));
    assert_eq!(w.status, 200, "{}", w.body);
    assert_eq!(
        w.body["invalidation"], "deferred",
        "acknowledged as done while the replica held nothing: {}",
        w.body
    );
    // Until it lands, this sidecar serves nothing from Redis: the new row, from Postgres.
    let during = s.client.query(read(1));
    assert_eq!(
        (
            during.body["rows"][0]["n"].as_i64(),
            during.body["cache"].as_str()
        ),
        (Some(1), Some("bypass"))
    );
    cluster.nodes[replica].resume();
    ferry_testkit::wait_until(
        "the deferred invalidation to land",
        Duration::from_secs(10),
        || s.client.query(read(1)).body["cache"] == "hit",
    );
    assert_eq!(s.client.query(read(1)).body["rows"][0]["n"], 1);
}

/// What the load saw, shared by its readers and its writer.
#[derive(Default)]
struct Load {
    /// The value each id had when its latest write was acknowledged.
    acked: Mutex<HashMap<i64, i64>>,
    stop: AtomicBool,
    reads: AtomicU64,
    failed: AtomicU64,
    /// Reads that returned a value older than one acknowledged before they began.
    stale: AtomicU64,
    hits: AtomicU64,
    hit_times: Mutex<Vec<Instant>>,
}

impl Load {
    fn saw(&self, floor: i64, a: &ferry_testkit::client::Answer) {
        self.reads.fetch_add(1, Ordering::SeqCst);
        match a.body["rows"][0]["n"].as_i64() {
            Some(n) if a.status == 200 => {
                if n < floor {
                    self.stale.fetch_add(1, Ordering::SeqCst);
                }
                if a.body["cache"] == "hit" {
                    self.hits.fetch_add(1, Ordering::SeqCst);
                    self.hit_times.lock().expect("lock").push(Instant::now());
                }
            }
            _ => {
                self.failed.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[test]
fn a_master_killed_under_reads_and_writes_loses_nothing() {
    // Two replicas per master: the promoted one still has a replica to WAIT for.
    let mut cluster = RedisCluster::start(3, 2);
    let pg = postgres();
    let s = sidecar(&cluster, &pg, &[]);
    const IDS: i64 = 30;
    let load_state = Arc::new(Load::default());
    let c = s.client.clone();
    let load = {
        let l = load_state.clone();
        std::thread::spawn(move || {
            c.block_on(async {
                let readers = (0..8).map(|r| {
                    let (c, l) = (c.clone(), l.clone());
                    async move {
                        let mut i = r;
                        while !l.stop.load(Ordering::SeqCst) {
                            i += 1;
                            let id = i % IDS + 1;
                            let floor = l.acked.lock().expect("lock").get(&id).copied();
                            let a = c.query_async(read(id)).await;
                            l.saw(floor.unwrap_or(0), &a);
                        }
                    }
                });
                let writer = {
                    let (c, l) = (c.clone(), l.clone());
                    async move {
                        let mut i = 0;
                        while !l.stop.load(Ordering::SeqCst) {
                            i += 1;
                            let id = i % IDS + 1;
                            // One writer: each id's values only grow.
                            let a = c.post("/v1/execute", &write(id, i)).await;
                            if a.status == 200 {
                                l.acked.lock().expect("lock").insert(id, i);
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                };
                futures::future::join(futures::future::join_all(readers), writer).await;
            })
        })
    };
    let (stop, hit_times) = (&load_state.stop, &load_state.hit_times);
    std::thread::sleep(Duration::from_millis(1500));
    let victim = master_holding(&cluster, 1);
    cluster.nodes[victim].kill();
    let killed = Instant::now();
    cluster.wait_healthy(Duration::from_secs(30));
    let healed = Instant::now();
    ferry_testkit::wait_until("hits after the failover", Duration::from_secs(10), || {
        hit_times.lock().expect("lock").iter().any(|t| *t > healed)
    });
    let first_hit = hit_times
        .lock()
        .expect("lock")
        .iter()
        .copied()
        .filter(|t| *t > healed)
        .min();
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::SeqCst);
    load.join().expect("load");
    let l = &load_state;
    let (reads, failed, stale, hits) = (
        l.reads.load(Ordering::SeqCst),
        l.failed.load(Ordering::SeqCst),
        l.stale.load(Ordering::SeqCst),
        l.hits.load(Ordering::SeqCst),
    );
    println!(
        "FIGURES redis cluster master SIGKILL: {reads} reads, {failed} failed, {stale} older than \
         an acknowledged write, {hits} hits; failover took {:?}, first hit {:?} after the cluster \
         was ok again",
        healed - killed,
        first_hit.map(|t| t - healed)
    );
    assert_eq!(failed, 0, "reads failed while a master died");
    assert_eq!(
        stale, 0,
        "reads returned values older than an acknowledged write"
    );
    // No acknowledged invalidation lost: every cached read, once hits are back, is Postgres's
    // own row.
    for id in 1..=IDS {
        let truth: i64 = pg
            .client()
            .query_one("SELECT n FROM items WHERE id = $1", &[&(id as i32)])
            .expect("row")
            .get(0);
        let a = s.client.query(read(id));
        assert_eq!(
            a.body["rows"][0]["n"].as_i64(),
            Some(truth),
            "id {id}: {}",
            a.body
        );
    }
}

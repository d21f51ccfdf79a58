//! A private Redis Cluster: masters with replicas, each a `RedisServer` on free ports, joined
//! by `redis-cli --cluster create`. Nodes can be killed, frozen and restarted (a restarted
//! node keeps its nodes.conf and rejoins, as a replica if it lost its slots meanwhile).

use super::{find_program, free_port, wait_until, RedisServer};
use redis::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters with `replicas` replicas each, every slot covered, every replica in
    /// sync. Node timeout 1 s: a dead master is replaced within a few seconds.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                // The bus port is chosen too: the default (port + 10000) could land on a port
                // another test was given.
                let bus = free_port().to_string();
                RedisServer::start_with_args(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
        let cli = find_program(
            "redis-cli",
            &[],
            "Install Redis: apt-get install redis-tools.",
        );
        let out = Command::new(cli)
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// The seed URLs, comma-separated (`redis.url` with `redis.cluster = true`).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.url())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn ask(&self, i: usize, args: &[&str]) -> Option<Value> {
        if !self.nodes[i].is_running() {
            return None;
        }
        let client = redis::Client::open(self.nodes[i].url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        conn.set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn).ok()
    }

    fn text(&self, i: usize, args: &[&str]) -> String {
        match self.ask(i, args) {
            Some(v) => redis::from_redis_value::<String>(v).unwrap_or_default(),
            None => String::new(),
        }
    }

    /// Every running node sees the cluster ok with all slots served, and every running
    /// replica's link to its master is up.
    pub fn healthy(&self) -> bool {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running())
            .all(|i| {
                let info = self.text(i, &["CLUSTER", "INFO"]);
                let repl = self.text(i, &["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            })
    }

    pub fn wait_healthy(&self, timeout: Duration) {
        wait_until("the Redis Cluster to be healthy", timeout, || {
            self.healthy()
        });
    }

    /// The node that serves `key`'s slot as master now, by a running node's CLUSTER SLOTS.
    pub fn master_of(&self, key: &str) -> usize {
        let asker = (0..self.nodes.len())
            .find(|&i| self.nodes[i].is_running())
            .expect("a running node");
        let slot: i64 = self
            .ask(asker, &["CLUSTER", "KEYSLOT", key])
            .and_then(|v| redis::from_redis_value(v).ok())
            .expect("CLUSTER KEYSLOT");
        let Some(Value::Array(ranges)) = self.ask(asker, &["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS");
        };
        for range in ranges {
            let Value::Array(r) = range else { continue };
            let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(master))) =
                (r.first(), r.get(1), r.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&slot) {
                let Some(Value::Int(port)) = master.get(1) else {
                    continue;
                };
                return self
                    .nodes
                    .iter()
                    .position(|n| i64::from(n.port) == *port)
                    .expect("the master is one of ours");
            }
        }
        panic!("slot {slot} has no master");
    }

    /// The running nodes that replicate node `i`.
    pub fn replicas_of(&self, i: usize) -> Vec<usize> {
        let port = format!("master_port:{}", self.nodes[i].port);
        (0..self.nodes.len())
            .filter(|&r| r != i && self.text(r, &["INFO", "replication"]).contains(&port))
            .collect()
    }

    /// CPU seconds (user + system) all running nodes have used so far, from `INFO cpu`.
    pub fn cpu_seconds(&self) -> f64 {
        (0..self.nodes.len())
            .map(|i| {
                let info = self.text(i, &["INFO", "cpu"]);
                let field = |name: &str| -> f64 {
                    info.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0.0)
                };
                field("used_cpu_sys") + field("used_cpu_user")
            })
            .sum()
    }

    /// The keys on node `i` that match `pattern` (KEYS: test-sized data only).
    pub fn keys_matching(&self, i: usize, pattern: &str) -> Vec<String> {
        self.ask(i, &["KEYS", pattern])
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or_default()
    }

    /// Keys stored on node `i` (0 when it is not running).
    pub fn keys_on(&self, i: usize) -> i64 {
        self.ask(i, &["DBSIZE"])
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or(0)
    }
}

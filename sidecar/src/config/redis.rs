//! `[redis]`: one server, or a Redis Cluster.

use super::RedactedUrl;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// redis:// URL, or rediss:// for TLS (password in the URL or in FERRY_REDIS_URL). With
    /// `cluster = true`, the seed nodes, comma-separated: any one that answers gives the rest.
    pub url: RedactedUrl,
    /// PEM CA certificate(s) to trust for rediss:// (a private CA); empty: the system's roots.
    pub tls_ca_path: String,
    /// Redis Cluster (the redis crate's cluster client). Ferry's keys then carry hash tags so
    /// that each script's keys share a slot (docs/design/2026-12-many-sidecars.md).
    pub cluster: bool,
    /// Cluster only: replicas that must hold an invalidation (WAIT) before it counts as done,
    /// so that a master dying right after answering cannot take it with it. Not acknowledged
    /// in time: the invalidation is deferred and retried, and this sidecar serves no cached
    /// read until it lands. 0 turns the wait off: unsafe, a failover may then lose an
    /// acknowledged invalidation and serve the old rows again.
    pub cluster_wait_replicas: u32,
    /// Cluster only: how long that wait may take, in milliseconds.
    pub cluster_wait_ms: u64,
    /// Most connections the pool ever opens (in a cluster: pooled clients, each with one
    /// connection per master).
    pub pool_size: u32,
    /// Idle connections kept open.
    pub min_idle: u32,
    /// Longest wait for a pooled connection, in milliseconds.
    pub checkout_timeout_ms: u64,
    /// TCP connect timeout for a new connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Read/write timeout of one Redis command, in milliseconds.
    pub io_timeout_ms: u64,
    /// After a Redis failure, reads skip Redis for this long, in milliseconds, instead of
    /// paying a timeout each; then one read per window probes it (half-open).
    pub retry_after_failure_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379".into(),
            tls_ca_path: String::new(),
            cluster: false,
            cluster_wait_replicas: 1,
            cluster_wait_ms: 200,
            pool_size: 8,
            min_idle: 1,
            checkout_timeout_ms: 1_000,
            connect_timeout_ms: 500,
            io_timeout_ms: 1_000,
            retry_after_failure_ms: 250,
        }
    }
}

impl RedisConfig {
    /// The node URLs: one, or a cluster's seeds.
    pub fn urls(&self) -> Vec<&str> {
        if self.cluster {
            self.url
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .collect()
        } else {
            vec![self.url.as_str()]
        }
    }
}

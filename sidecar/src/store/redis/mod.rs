//! Redis connections, to one server or to a Redis Cluster: the clients (rediss:// with a
//! private CA), the r2d2 pool's connections (`pooled`) and the workers' multiplexed ones
//! (`multiplexed`).
//!
//! On a cluster the redis crate's cluster client routes each command to its slot's master,
//! follows MOVED/ASK and reloads the slot map after a failover. A pipeline whose keys span
//! slots is split: by node on the pooled connection (`RedisSession::query_pipe`), by slot on a
//! multiplexed one, the groups sent at once (`AsyncConn::query_pipe`).

mod multiplexed;
mod pooled;

pub(crate) use multiplexed::{send_by_slot, AsyncConn, AsyncRedis, SlotPipes};
pub(crate) use pooled::{slot, RedisManager};

use crate::config::RedisConfig;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use std::time::Duration;

/// Whether Redis ended the connection (`CLIENT KILL`, an idle `timeout`, a restart): the
/// connection is lost, which is not yet Redis down (a new one may connect at once).
pub(crate) fn connection_lost(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
}

/// One server, or a cluster. (Built once per pool: the variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(crate) enum RedisClient {
    Single(redis::Client),
    Cluster(ClusterClient),
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URLs: they may hold the password.
        f.write_str(match self {
            RedisClient::Single(_) => "RedisClient::Single",
            RedisClient::Cluster(_) => "RedisClient::Cluster",
        })
    }
}

/// The client the pools use: the cluster client with `redis.cluster`, else one server's.
pub(crate) fn store_client(c: &RedisConfig) -> Result<RedisClient, String> {
    if !c.cluster {
        return redis_client(c).map(RedisClient::Single);
    }
    let urls = c.urls();
    let mut b = ClusterClientBuilder::new(urls.iter().map(|u| u.to_string()))
        .connection_timeout(Duration::from_millis(c.connect_timeout_ms))
        .response_timeout(Duration::from_millis(c.io_timeout_ms))
        // One retry, soon: a master that is down is answered by bypassing the cache, not by
        // holding the request through the failover.
        .retries(1)
        .min_retry_wait(10)
        .max_retry_wait(100);
    if !c.tls_ca_path.is_empty() {
        b = b.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(read_ca(c)?),
        });
    }
    b.build()
        .map(RedisClient::Cluster)
        .map_err(|_| "not a comma-separated list of redis:// or rediss:// URLs".to_string())
}

/// One server's client: `redis.url`, or with `redis.cluster` each seed node's (the fill
/// wake-up listener subscribes on any node: a cluster relays PUBLISH to every node).
pub(crate) fn node_clients(c: &RedisConfig) -> Result<Vec<redis::Client>, String> {
    c.urls()
        .into_iter()
        .map(|url| {
            let info = redis::IntoConnectionInfo::into_connection_info(url)
                .map_err(|_| "not a valid redis:// or rediss:// URL".to_string())?;
            client_for(c, info)
        })
        .collect()
}

/// The client of `redis.url` (one server).
pub(crate) fn redis_client(c: &RedisConfig) -> Result<redis::Client, String> {
    let info = redis::IntoConnectionInfo::into_connection_info(c.url.as_str())
        .map_err(|_| "not a valid redis:// or rediss:// URL".to_string())?;
    client_for(c, info)
}

fn read_ca(c: &RedisConfig) -> Result<Vec<u8>, String> {
    std::fs::read(&c.tls_ca_path).map_err(|e| format!("redis.tls_ca_path {}: {e}", c.tls_ca_path))
}

fn client_for(c: &RedisConfig, info: redis::ConnectionInfo) -> Result<redis::Client, String> {
    if c.tls_ca_path.is_empty() {
        return redis::Client::open(info)
            .map_err(|_| "not a valid redis:// or rediss:// URL".to_string());
    }
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(read_ca(c)?),
        },
    )
    .map_err(|_| "not a valid rediss:// URL, or redis.tls_ca_path is not a PEM CA".to_string())
}

//! `[replicas]`: Postgres streaming replicas that plain reads may go to (read-your-writes with
//! the positions writes return).

use super::{Config, ConfigError, RedactedUrl};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicasConfig {
    /// Streaming replicas of `postgres.url`'s server, as postgres:// URLs (the same role;
    /// `postgres.password_file`, `tls_ca_path`, `connect_timeout_ms` and `statement_timeout_ms`
    /// apply). Empty: every read goes to the primary, and writes return no position.
    pub urls: Vec<RedactedUrl>,
    /// Most connections the sidecar opens to each replica.
    pub pool_size: u32,
    /// A replica further behind the primary than this, in milliseconds, is taken out of use
    /// until it catches up (and so is one that does not answer).
    pub max_lag_ms: u64,
    /// How often each replica's replay position is read, in milliseconds: a read carrying a
    /// position goes to a replica once a check has seen it past that position.
    pub poll_ms: u64,
    /// Which reads replicas serve. `after_position` (the default): only reads that carry a
    /// position (`after`) a replica has passed; all others go to the primary, so a read never
    /// misses a write acknowledged before it. `any` (opt-in): reads without a position go to a
    /// replica too, and may miss writes of the last `max_lag_ms` (a writer's own included, if
    /// it does not pass its position).
    pub reads: ReplicaReads,
}

/// `replicas.reads`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaReads {
    AfterPosition,
    Any,
}

impl Default for ReplicasConfig {
    fn default() -> Self {
        ReplicasConfig {
            urls: Vec::new(),
            pool_size: 4,
            max_lag_ms: 1_000,
            poll_ms: 50,
            reads: ReplicaReads::AfterPosition,
        }
    }
}

impl Config {
    pub(super) fn validate_replicas(&self) -> Result<(), ConfigError> {
        let r = &self.replicas;
        let invalid = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                key: key.into(),
                message: message.into(),
            })
        };
        if r.urls.len() > 16 {
            return invalid("replicas.urls", "at most 16 replicas");
        }
        if r.pool_size == 0 {
            return invalid("replicas.pool_size", "must be at least 1");
        }
        if !(10..=60_000).contains(&r.poll_ms) {
            return invalid("replicas.poll_ms", "must be 10 to 60000 (milliseconds)");
        }
        if r.max_lag_ms < r.poll_ms {
            return invalid(
                "replicas.max_lag_ms",
                "must be at least replicas.poll_ms (a replica is checked that often)",
            );
        }
        Ok(())
    }
}

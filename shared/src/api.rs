//! Request and response bodies of the `/v1` endpoints (JSON).
//!
//! Requests refuse unknown fields: a field this sidecar does not know would otherwise be
//! silently ignored, and a caller asking for a behaviour it does not get is worse than a 400.
//! Responses may gain fields within `/v1`; clients must ignore fields they do not know.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Paths of the v1 endpoints.
pub mod paths {
    pub const QUERY: &str = "/v1/query";
    pub const EXECUTE: &str = "/v1/execute";
    pub const CACHE: &str = "/v1/cache";
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
}

/// `POST /v1/query`: a read, optionally through the cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    pub sql: String,
    /// Positional parameters `$1..$n`, bound to the types Postgres infers for them.
    #[serde(default)]
    pub params: Vec<Value>,
    /// Absent: straight to Postgres (`"cache": "bypass"` in the answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CachePolicy>,
}

/// How a read uses the cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachePolicy {
    /// Time to live of the cached result, in seconds (at least 1).
    pub ttl_s: u64,
    /// A name for the entry, so a write can invalidate it by name (`"item:42"`). Absent: the
    /// entry is named by a hash of the statement and its parameters (returned as `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Where a read's rows came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheStatus {
    /// Served from Redis; Postgres was not touched.
    Hit,
    /// Not in Redis: run on Postgres and written back with the TTL.
    Miss,
    /// The cache was not used: no cache policy, or Redis unavailable.
    Bypass,
}

/// One result row: column name to JSON value.
pub type Row = Map<String, Value>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryResponse {
    pub rows: Vec<Row>,
    pub cache: CacheStatus,
    /// Age of the rows in milliseconds: 0 when just read from Postgres.
    pub age_ms: u64,
    /// The entry's cache key (what `invalidate.keys` takes), when the cache was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `POST /v1/execute`: a write, then cache invalidation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub sql: String,
    #[serde(default)]
    pub params: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidate: Option<Invalidate>,
}

/// Cache entries to drop after a write commits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invalidate {
    /// Query cache keys: a `cache.key` given on reads, or the `key` a read returned.
    #[serde(default)]
    pub keys: Vec<String>,
}

/// What happened to the invalidation a write asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidationStatus {
    /// Nothing was asked.
    None,
    /// The entries are gone from Redis.
    Done,
    /// Redis was unavailable: the sidecar holds the keys and deletes them as soon as Redis is
    /// back; until then it serves no read from the cache, so no read sees the old value.
    Deferred,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteResponse {
    pub rows_affected: u64,
    pub invalidation: InvalidationStatus,
}

/// `POST /v1/cache`: plain cache commands on caller-managed keys. Values are UTF-8 strings.
/// These keys live in their own namespace, apart from query cache entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum CacheCommand {
    Get {
        key: String,
    },
    /// `ttl_s` absent: the key does not expire.
    Set {
        key: String,
        value: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_s: Option<u64>,
    },
    Del {
        keys: Vec<String>,
    },
    Mget {
        keys: Vec<String>,
    },
    /// All entries are written atomically, each with the same optional TTL.
    Mset {
        entries: Vec<CacheEntry>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_s: Option<u64>,
    },
    /// Adds `by` (default 1) to an integer value; a missing key counts as 0.
    Incr {
        key: String,
        #[serde(default = "one")]
        by: i64,
    },
    Expire {
        key: String,
        ttl_s: u64,
    },
}

fn one() -> i64 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheEntry {
    pub key: String,
    pub value: String,
}

/// The answer to a [`CacheCommand`], tagged with the same `op`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum CacheReply {
    Get {
        value: Option<String>,
    },
    Set {},
    Del {
        deleted: u64,
    },
    Mget {
        values: Vec<Option<String>>,
    },
    Mset {},
    Incr {
        value: i64,
    },
    /// `applied` is false when the key does not exist.
    Expire {
        applied: bool,
    },
}

/// `GET /readyz`: each dependency's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    pub redis: DependencyState,
    pub postgres: DependencyState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DependencyState {
    Up,
    Down,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn query_request_minimal_and_full() {
        let r: QueryRequest = serde_json::from_value(json!({"sql": "select 1"})).expect("minimal");
        assert!(r.params.is_empty() && r.cache.is_none());
        let r: QueryRequest = serde_json::from_value(
            json!({"sql": "select $1", "params": [1], "cache": {"ttl_s": 60, "key": "k"}}),
        )
        .expect("full");
        assert_eq!(r.cache.and_then(|c| c.key).as_deref(), Some("k"));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<QueryRequest, _> =
            serde_json::from_value(json!({"sql": "select 1", "cahce": {}}));
        assert!(r.is_err());
        let r: Result<CacheCommand, _> =
            serde_json::from_value(json!({"op": "get", "key": "a", "extra": 1}));
        assert!(r.is_err());
    }

    #[test]
    fn cache_commands_are_tagged_by_op() {
        let c: CacheCommand =
            serde_json::from_value(json!({"op": "incr", "key": "n"})).expect("incr");
        assert_eq!(
            c,
            CacheCommand::Incr {
                key: "n".into(),
                by: 1
            }
        );
        let reply = serde_json::to_value(CacheReply::Get { value: None }).expect("ser");
        assert_eq!(reply, json!({"op": "get", "value": null}));
    }
}

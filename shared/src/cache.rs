//! `/v1/cache`'s wire types (re-exported from `api`).

use serde::{Deserialize, Serialize};

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

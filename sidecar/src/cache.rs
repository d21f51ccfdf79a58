//! The read-through query cache in Redis, and invalidation that a racing read cannot undo.
//!
//! Keys (all under `cache.key_prefix`, default `ferry:`):
//! - `q:<key>`: a cached result, JSON `{"at_ms": <unix ms when read from Postgres>, "rows": [...]}`.
//!   `<key>` is the caller's `cache.key`, or `sha256:<hex>` of the statement and parameters.
//! - `v:<key>`: the entry's invalidation version, bumped by every invalidation.
//! - `k:<key>`: plain cache command keys (see `commands.rs`), a namespace of their own.
//!
//! The race this prevents: a read misses, reads the old row from Postgres, a write commits and
//! deletes the entry, then the read writes the old row back, to be served until its TTL ends.
//! A read therefore notes the version before going to Postgres, and writes back through a Lua
//! script only if the version is unchanged; invalidation bumps the version and deletes the
//! entry in one MULTI. Whichever order they run in, the stale row is never left behind.
//!
//! Redis down: reads bypass the cache. An invalidation that cannot reach Redis is kept in
//! memory and retried in the background; until it succeeds this sidecar serves no read from
//! Redis, so no read after an acknowledged write can see the old value through this sidecar.

use crate::pools::Pools;
use ferry_shared::api::{InvalidationStatus, Row};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes back only if no invalidation happened since the read looked the version up.
/// KEYS[1] entry, KEYS[2] version; ARGV[1] version seen, ARGV[2] value, ARGV[3] ttl seconds.
const WRITE_BACK: &str = r"
local v = redis.call('GET', KEYS[2])
if (v or '0') == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
";

/// Prefix of hash-named entries; caller-chosen keys may not start with it.
pub const HASH_KEY_PREFIX: &str = "sha256:";

#[derive(Serialize, Deserialize)]
struct Entry {
    at_ms: u64,
    rows: Vec<Row>,
}

pub enum Lookup {
    /// Served from Redis.
    Hit { rows: Vec<Row>, age_ms: u64 },
    /// Not cached; `version` must be passed to [`Cache::store`].
    Miss { version: String },
    /// Redis unavailable, or invalidations pending: do not use the cache for this read.
    Bypass,
}

pub struct Cache {
    prefix: String,
    /// How long a version key outlives its last bump, in seconds. It must outlast the longest
    /// read in flight (bounded by the request timeout), or that read could write back.
    version_ttl_s: u64,
    write_back: redis::Script,
    /// Keys whose invalidation could not reach Redis yet.
    pending: Mutex<BTreeSet<String>>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Cache {
    pub fn new(prefix: &str, request_timeout_s: u64) -> Self {
        Cache {
            prefix: prefix.to_string(),
            version_ttl_s: (request_timeout_s * 10).max(3600),
            write_back: redis::Script::new(WRITE_BACK),
            pending: Mutex::new(BTreeSet::new()),
        }
    }

    /// The entry's key as callers name it: theirs, or a hash of statement and parameters.
    pub fn logical_key(sql: &str, params: &[Value], explicit: Option<&str>) -> String {
        if let Some(k) = explicit {
            return k.to_string();
        }
        let mut h = Sha256::new();
        h.update(sql.as_bytes());
        h.update([0u8]);
        // serde_json writes a Value the same way every time (object keys sorted).
        h.update(Value::Array(params.to_vec()).to_string().as_bytes());
        format!("{HASH_KEY_PREFIX}{}", hex::encode(h.finalize()))
    }

    fn entry_key(&self, logical: &str) -> String {
        format!("{}q:{logical}", self.prefix)
    }

    fn version_key(&self, logical: &str) -> String {
        format!("{}v:{logical}", self.prefix)
    }

    pub fn plain_key(&self, key: &str) -> String {
        format!("{}k:{key}", self.prefix)
    }

    fn pending(&self) -> MutexGuard<'_, BTreeSet<String>> {
        // A poisoned lock still holds a valid set; losing pending keys would be worse.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether reads may use Redis right now.
    fn usable(&self, pools: &Pools) -> bool {
        pools.redis_available() && self.pending().is_empty()
    }

    pub fn lookup(&self, pools: &Pools, logical: &str) -> Lookup {
        if !self.usable(pools) {
            return Lookup::Bypass;
        }
        // redis_conn trips the breaker itself when it fails.
        let Ok(mut conn) = pools.redis_conn() else {
            return Lookup::Bypass;
        };
        let result: redis::RedisResult<(Option<Vec<u8>>, Option<String>)> = redis::pipe()
            .get(self.entry_key(logical))
            .get(self.version_key(logical))
            .query(&mut *conn);
        match result {
            Ok((Some(bytes), _)) => match serde_json::from_slice::<Entry>(&bytes) {
                Ok(e) => Lookup::Hit {
                    age_ms: now_ms().saturating_sub(e.at_ms),
                    rows: e.rows,
                },
                // Not ours or from an older format: treat as a miss, the write-back replaces it.
                Err(_) => Lookup::Miss {
                    version: "0".into(),
                },
            },
            Ok((None, version)) => Lookup::Miss {
                version: version.unwrap_or_else(|| "0".into()),
            },
            Err(e) => {
                tracing::warn!(error = %e, "redis lookup failed; serving from postgres");
                pools.mark_redis_failed();
                Lookup::Bypass
            }
        }
    }

    /// Writes a freshly read result back, unless an invalidation ran since `version` was read.
    /// Failures only cost a future miss, so they are logged, not returned.
    pub fn store(&self, pools: &Pools, logical: &str, version: &str, rows: &[Row], ttl_s: u64) {
        if !self.usable(pools) {
            return;
        }
        let entry = serde_json::json!({ "at_ms": now_ms(), "rows": rows });
        let result = pools
            .redis_conn()
            .map_err(|e| e.to_string())
            .and_then(|mut conn| {
                self.write_back
                    .key(self.entry_key(logical))
                    .key(self.version_key(logical))
                    .arg(version)
                    .arg(entry.to_string())
                    .arg(ttl_s)
                    .invoke::<i64>(&mut *conn)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = result {
            tracing::warn!(error = %e, "redis write-back failed");
            pools.mark_redis_failed();
        }
    }

    /// Invalidates entries after a write committed. If Redis cannot be reached the keys are
    /// kept and retried (see the module docs), and the answer says `deferred`.
    pub fn invalidate(&self, pools: &Pools, keys: &[String]) -> InvalidationStatus {
        if keys.is_empty() {
            return InvalidationStatus::None;
        }
        match self.try_invalidate(pools, keys) {
            Ok(()) => InvalidationStatus::Done,
            Err(e) => {
                tracing::warn!(error = %e, keys = keys.len(), "invalidation deferred: redis unavailable");
                pools.mark_redis_failed();
                self.pending().extend(keys.iter().cloned());
                InvalidationStatus::Deferred
            }
        }
    }

    fn try_invalidate(&self, pools: &Pools, keys: &[String]) -> Result<(), String> {
        let mut conn = pools.redis_conn().map_err(|e| e.to_string())?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for k in keys {
            let v = self.version_key(k);
            pipe.incr(&v, 1)
                .ignore()
                .expire(&v, self.version_ttl_s as i64)
                .ignore()
                .del(self.entry_key(k))
                .ignore();
        }
        pipe.query::<()>(&mut *conn).map_err(|e| e.to_string())
    }

    /// Retries pending invalidations; called periodically in the background.
    pub fn flush_pending(&self, pools: &Pools) {
        let keys: Vec<String> = self.pending().iter().cloned().collect();
        if keys.is_empty() {
            return;
        }
        match self.try_invalidate(pools, &keys) {
            Ok(()) => {
                let mut pending = self.pending();
                for k in &keys {
                    pending.remove(k);
                }
                tracing::info!(keys = keys.len(), "deferred invalidations applied");
            }
            Err(e) => tracing::debug!(error = %e, "deferred invalidations still waiting for redis"),
        }
    }

    pub fn pending_count(&self) -> usize {
        self.pending().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hash_keys_are_stable_and_distinct() {
        let a = Cache::logical_key("select $1", &[json!(1)], None);
        assert_eq!(a, Cache::logical_key("select $1", &[json!(1)], None));
        assert_ne!(a, Cache::logical_key("select $1", &[json!("1")], None));
        assert_ne!(a, Cache::logical_key("select $1 ", &[json!(1)], None));
        assert!(a.starts_with(HASH_KEY_PREFIX));
        assert_eq!(Cache::logical_key("x", &[], Some("item:1")), "item:1");
    }
}

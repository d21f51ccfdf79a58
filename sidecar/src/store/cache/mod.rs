//! The read-through query cache in Redis, and invalidation that a racing read cannot undo.
//!
//! Keys (all under `cache.key_prefix`, default `ferry:`):
//! - `q:<key>#<fingerprint>`: a cached result, JSON `Entry`. `<key>` is the caller's
//!   `cache.key` or `<keyspace>:<id>`, and the fingerprint is a hash of the statement and its
//!   parameters, so another statement under the same key is stored apart and never served in
//!   its place. Without a caller's key the entry is `q:sha256:<hash of statement and params>`.
//! - `v:<key>`: the key's version, a random token replaced by every invalidation of the key.
//! - `t:<tag>`: a tag's version, a random token replaced by every invalidation of the tag.
//! - `epoch`: the cache-wide version every entry carries (moved when invalidations that waited
//!   for Redis overflowed their bound: everything is invalid at once).
//! - `k:<key>`: plain cache command keys (see `commands.rs`), a namespace of their own.
//!
//! An entry records the versions it was read under and is valid only while all are current.
//! Versions are random and never reused, and a missing one (evicted, expired) matches no entry,
//! so no eviction can make an invalidated entry valid again. A key's version lives at least as
//! long as the entries written under it.
//!
//! The race this prevents: a read misses, reads the old row from Postgres, a write commits and
//! invalidates, then the read writes the old row back. So a read notes the versions *before*
//! going to Postgres ([`Observed`]), and writes back through a Lua script only if none changed;
//! invalidation replaces them (and deletes the entry) in one MULTI. Whichever order reads and
//! writes run in, no invalidated row is served.
//!
//! Redis down: reads bypass the cache. An invalidation that cannot reach Redis is kept in
//! memory (bounded, see `pending.rs`) and retried in the background; until it succeeds this
//! sidecar serves no read from Redis, so no read after an acknowledged write can see the old
//! value through this sidecar.

mod entry;
mod pending;

pub use entry::Lookup;

use crate::store::pools::Pools;
use entry::{classify, Entry};
use ferry_shared::api::{InvalidationStatus, Row};
use pending::{Chunk, Pending};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes back only if no version moved since the read observed them. KEYS[1] entry,
/// KEYS[2] key version, KEYS[3..] tag versions (the epoch among them). ARGV[1] value, ARGV[2]
/// TTL in seconds, ARGV[3] key version seen, ARGV[4..] tag versions seen. A version that went
/// missing (evicted) counts as moved. The key's version is kept at least as long as the entry.
const WRITE_BACK: &str = r"
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[i + 1] then return 0 end
end
local ttl = tonumber(ARGV[2])
local left = redis.call('TTL', KEYS[2])
if left >= 0 and left < ttl then redis.call('EXPIRE', KEYS[2], ttl) end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
return 1
";

/// Prefix of hash-named entries; caller-chosen keys may not start with it.
pub const HASH_KEY_PREFIX: &str = "sha256:";

/// The implicit tag every entry carries: the cache-wide epoch (not a name callers can send:
/// tags may not contain control characters).
const EPOCH_TAG: &str = "\u{0}epoch";

/// Pending invalidations applied per MULTI, so a long outage's backlog never makes one
/// transaction too large to finish within Redis' timeouts.
const FLUSH_CHUNK: usize = 500;

/// How long an entry lives and what it is tagged with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryPolicy {
    pub ttl_s: u64,
    pub swr_s: u64,
    pub stale_if_error_s: u64,
}

/// What a read saw before it went to Postgres; its write-back is conditional on it. Every
/// version is a real token: the lookup creates the ones that did not exist, so "absent" is
/// never a version a write-back can match after an eviction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The Redis key of the entry (key and statement fingerprint).
    entry_key: String,
    version: String,
    tags: BTreeMap<String, String>,
}

/// One lookup to make: the entry's key, its statement's fingerprint, the tags the read carries.
pub struct Probe<'a> {
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub tags: &'a [String],
}

/// What a write-back did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Written,
    /// Larger than `cache.max_entry_bytes`: answered but not cached.
    TooLarge,
    /// Redis unavailable, or an invalidation ran since the read observed the versions.
    NotWritten,
}

pub struct Cache {
    prefix: String,
    /// How long a key version outlives its last replacement, in seconds. It must outlast the
    /// longest read in flight (bounded by the request timeout), or that read could write back.
    version_ttl_s: u64,
    /// Entries larger than this are not written.
    max_entry_bytes: usize,
    /// Keys and tags whose invalidation could not reach Redis yet.
    pending: Mutex<Pending>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh version token: 128 random bits, never reused in practice.
fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Cache {
    pub fn new(
        prefix: &str,
        request_timeout_s: u64,
        max_entry_bytes: usize,
        max_pending: usize,
    ) -> Self {
        Cache {
            prefix: prefix.to_string(),
            version_ttl_s: (request_timeout_s * 10).max(3600),
            max_entry_bytes,
            pending: Mutex::new(Pending::new(max_pending)),
        }
    }

    /// The hash of a statement and its parameters (hex SHA-256).
    pub fn fingerprint(sql: &str, params: &[Value]) -> String {
        let mut h = Sha256::new();
        h.update(sql.as_bytes());
        h.update([0u8]);
        // serde_json writes a Value the same way every time (object keys sorted).
        h.update(Value::Array(params.to_vec()).to_string().as_bytes());
        hex::encode(h.finalize())
    }

    /// The entry's key as callers name it: theirs, or `sha256:` and the fingerprint.
    pub fn logical_key(fingerprint: &str, explicit: Option<&str>) -> String {
        match explicit {
            Some(k) => k.to_string(),
            None => format!("{HASH_KEY_PREFIX}{fingerprint}"),
        }
    }

    fn entry_key(&self, logical: &str, fingerprint: &str) -> String {
        if logical.starts_with(HASH_KEY_PREFIX) {
            format!("{}q:{logical}", self.prefix)
        } else {
            // 128 bits of the fingerprint tell statements apart under one caller's key.
            let fp = fingerprint.get(..32).unwrap_or(fingerprint);
            format!("{}q:{logical}#{fp}", self.prefix)
        }
    }

    fn version_key(&self, logical: &str) -> String {
        format!("{}v:{logical}", self.prefix)
    }

    fn tag_key(&self, tag: &str) -> String {
        if tag == EPOCH_TAG {
            format!("{}epoch", self.prefix)
        } else {
            format!("{}t:{tag}", self.prefix)
        }
    }

    pub fn plain_key(&self, key: &str) -> String {
        format!("{}k:{key}", self.prefix)
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        // A poisoned lock still holds a valid set; losing pending keys would be worse.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether reads may use Redis right now.
    pub fn usable(&self, pools: &Pools) -> bool {
        pools.redis_available() && self.pending().is_empty()
    }

    /// Looks up many entries in one Redis round trip. Answers in the order of `probes`.
    pub fn lookup_many(&self, pools: &Pools, probes: &[Probe<'_>]) -> Vec<Lookup> {
        let bypass = || probes.iter().map(|_| Lookup::Bypass).collect();
        if probes.is_empty() || !self.usable(pools) {
            return bypass();
        }
        // redis_conn trips the breaker itself when it fails.
        let Ok(mut conn) = pools.redis_conn() else {
            return bypass();
        };
        // Each version is read with SET NX GET: an existing one is returned, a missing one is
        // created with a fresh token (the reply is then nil and the token ours).
        let mut pipe = redis::pipe();
        let mut tag_names: BTreeSet<&str> = BTreeSet::from([EPOCH_TAG]);
        let entry_keys: Vec<String> = probes
            .iter()
            .map(|p| self.entry_key(p.key, p.fingerprint))
            .collect();
        let mut fresh: Vec<String> = Vec::new();
        for (p, entry_key) in probes.iter().zip(&entry_keys) {
            let t = token();
            pipe.get(entry_key)
                .cmd("SET")
                .arg(self.version_key(p.key))
                .arg(&t)
                .arg("NX")
                .arg("GET")
                .arg("EX")
                .arg(self.version_ttl_s);
            fresh.push(t);
            tag_names.extend(p.tags.iter().map(String::as_str));
        }
        let mut fresh_tags: Vec<String> = Vec::new();
        for tag in &tag_names {
            let t = token();
            pipe.cmd("SET")
                .arg(self.tag_key(tag))
                .arg(&t)
                .arg("NX")
                .arg("GET");
            fresh_tags.push(t);
        }
        let values: Vec<Option<Vec<u8>>> = match pipe.query(&mut *conn) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "redis lookup failed; serving from postgres");
                pools.mark_redis_failed();
                return bypass();
            }
        };
        let current_or = |v: Option<Vec<u8>>, mine: String| match v {
            Some(b) => String::from_utf8(b).unwrap_or_default(),
            None => mine,
        };
        let mut values = values.into_iter();
        let mut found: Vec<(Option<Entry>, String)> = Vec::with_capacity(probes.len());
        for mine in fresh {
            let entry = values
                .next()
                .flatten()
                .and_then(|b| serde_json::from_slice::<Entry>(&b).ok());
            found.push((entry, current_or(values.next().flatten(), mine)));
        }
        let current: BTreeMap<String, String> = tag_names
            .iter()
            .zip(fresh_tags)
            .map(|(t, mine)| (t.to_string(), current_or(values.next().flatten(), mine)))
            .collect();
        let now = now_ms();
        probes
            .iter()
            .zip(found)
            .zip(entry_keys)
            .map(|((p, (entry, version)), entry_key)| {
                let tags = p
                    .tags
                    .iter()
                    .map(String::as_str)
                    .chain([EPOCH_TAG])
                    .map(|t| (t.to_string(), current.get(t).cloned().unwrap_or_default()))
                    .collect();
                let observed = Observed {
                    entry_key,
                    version,
                    tags,
                };
                classify(entry, observed, &current, now)
            })
            .collect()
    }

    /// Writes a freshly read result back, unless an invalidation ran since `observed` was read.
    /// Redis failures only cost a future miss, so they are logged, not returned.
    pub fn store(
        &self,
        pools: &Pools,
        key: &str,
        observed: &Observed,
        rows: &[Row],
        policy: &EntryPolicy,
    ) -> Stored {
        self.store_many(pools, &[(key, observed, rows)], policy)
            .first()
            .copied()
            .unwrap_or(Stored::NotWritten)
    }

    /// Writes many results back in one pipeline (see [`Cache::store`]).
    pub fn store_many(
        &self,
        pools: &Pools,
        items: &[(&str, &Observed, &[Row])],
        policy: &EntryPolicy,
    ) -> Vec<Stored> {
        let mut written = vec![Stored::NotWritten; items.len()];
        if items.is_empty() || !self.usable(pools) {
            return written;
        }
        let redis_ttl = policy.ttl_s + policy.swr_s.max(policy.stale_if_error_s);
        let mut pipe = redis::pipe();
        let mut sent = Vec::new();
        for (i, (key, observed, rows)) in items.iter().enumerate() {
            let entry = Entry {
                at_ms: now_ms(),
                ttl_ms: policy.ttl_s * 1000,
                swr_ms: policy.swr_s * 1000,
                sie_ms: policy.stale_if_error_s * 1000,
                ver: observed.version.clone(),
                tags: observed.tags.clone(),
                rows: rows.to_vec(),
            };
            let Ok(value) = serde_json::to_string(&entry) else {
                continue;
            };
            if value.len() > self.max_entry_bytes {
                written[i] = Stored::TooLarge;
                continue;
            }
            let c = pipe
                .cmd("EVAL")
                .arg(WRITE_BACK)
                .arg(2 + observed.tags.len())
                .arg(&observed.entry_key)
                .arg(self.version_key(key));
            for t in observed.tags.keys() {
                c.arg(self.tag_key(t));
            }
            c.arg(value).arg(redis_ttl).arg(&observed.version);
            for seen in observed.tags.values() {
                c.arg(seen);
            }
            sent.push(i);
        }
        if sent.is_empty() {
            return written;
        }
        let result = pools
            .redis_conn()
            .map_err(|e| e.to_string())
            .and_then(|mut conn| {
                pipe.query::<Vec<i64>>(&mut *conn)
                    .map_err(|e| e.to_string())
            });
        match result {
            Ok(flags) => {
                for (i, flag) in sent.into_iter().zip(flags) {
                    if flag == 1 {
                        written[i] = Stored::Written;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "redis write-back failed");
                pools.mark_redis_failed();
            }
        }
        written
    }

    /// Invalidates entries by key and by tag after a write committed. If Redis cannot be
    /// reached they are kept and retried (see the module docs), and the answer says `deferred`.
    pub fn invalidate(
        &self,
        pools: &Pools,
        keys: &[String],
        tags: &[String],
    ) -> InvalidationStatus {
        if keys.is_empty() && tags.is_empty() {
            return InvalidationStatus::None;
        }
        let chunk = Chunk {
            keys: keys.iter().map(|k| (k.clone(), 0)).collect(),
            tags: tags.iter().map(|t| (t.clone(), 0)).collect(),
            everything: None,
        };
        match self.try_invalidate(pools, &chunk) {
            Ok(()) => InvalidationStatus::Done,
            Err(e) => {
                tracing::warn!(error = %e, keys = keys.len(), tags = tags.len(), "invalidation deferred: redis unavailable");
                pools.mark_redis_failed();
                self.pending().add(keys, tags);
                InvalidationStatus::Deferred
            }
        }
    }

    /// Replaces the versions of the chunk's keys and tags (and the epoch) in one MULTI.
    fn try_invalidate(&self, pools: &Pools, chunk: &Chunk) -> Result<(), String> {
        let mut conn = pools.redis_conn().map_err(|e| e.to_string())?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (k, _) in &chunk.keys {
            pipe.cmd("SET")
                .arg(self.version_key(k))
                .arg(token())
                .arg("EX")
                .arg(self.version_ttl_s)
                .ignore()
                .del(format!("{}q:{k}", self.prefix))
                .ignore();
        }
        for (t, _) in &chunk.tags {
            pipe.set(self.tag_key(t), token()).ignore();
        }
        if chunk.everything.is_some() {
            pipe.set(self.tag_key(EPOCH_TAG), token()).ignore();
        }
        pipe.query::<()>(&mut *conn).map_err(|e| e.to_string())
    }

    /// Applies pending invalidations, a chunk at a time; called periodically in the background.
    pub fn flush_pending(&self, pools: &Pools) {
        loop {
            let chunk = self.pending().chunk(FLUSH_CHUNK);
            if chunk.is_empty() {
                return;
            }
            match self.try_invalidate(pools, &chunk) {
                Ok(()) => {
                    self.pending().applied(&chunk);
                    tracing::info!(
                        keys = chunk.keys.len(),
                        tags = chunk.tags.len(),
                        everything = chunk.everything.is_some(),
                        "deferred invalidations applied"
                    );
                }
                Err(e) => {
                    tracing::debug!(error = %e, "deferred invalidations still waiting for redis");
                    return;
                }
            }
        }
    }

    /// Keys and tags waiting for Redis (the whole-cache mark counts as one).
    pub fn pending_count(&self) -> usize {
        self.pending().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprints_are_stable_and_distinct() {
        let a = Cache::fingerprint("select $1", &[json!(1)]);
        assert_eq!(a, Cache::fingerprint("select $1", &[json!(1)]));
        assert_ne!(a, Cache::fingerprint("select $1", &[json!("1")]));
        assert_ne!(a, Cache::fingerprint("select $1 ", &[json!(1)]));
        assert!(Cache::logical_key(&a, None).starts_with(HASH_KEY_PREFIX));
        assert_eq!(Cache::logical_key(&a, Some("item:1")), "item:1");
    }

    #[test]
    fn statements_under_one_key_are_stored_apart() {
        let c = Cache::new("p:", 10, 1000, 10);
        let a = Cache::fingerprint("select 3", &[]);
        let b = Cache::fingerprint("select 4", &[]);
        assert_ne!(c.entry_key("row:4", &a), c.entry_key("row:4", &b));
        let hashed = Cache::logical_key(&a, None);
        assert_eq!(c.entry_key(&hashed, &a), format!("p:q:{hashed}"));
    }
}

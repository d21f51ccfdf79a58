//! The read-through query cache in Redis, and invalidation that a racing read cannot undo.
//!
//! Keys (all under `cache.key_prefix`, default `ferry:`):
//! - `q:<key>`: a cached result, JSON [`Entry`]. `<key>` is the caller's `cache.key`,
//!   `<keyspace>:<id>` for keyed batches, or `sha256:<hex>` of the statement and parameters.
//! - `v:<key>`: the entry's invalidation version, bumped by every invalidation of the key.
//! - `t:<tag>`: a tag's version, bumped by every invalidation of the tag. Never expires, so that
//!   an eviction can never make an invalidated entry look valid again (use a `noeviction` or
//!   `volatile-*` maxmemory policy: tag keys have no TTL, so those never evict them).
//! - `k:<key>`: plain cache command keys (see `commands.rs`), a namespace of their own.
//!
//! The race this prevents: a read misses, reads the old row from Postgres, a write commits and
//! invalidates, then the read writes the old row back. So a read notes the key's version and its
//! tags' versions *before* going to Postgres ([`Observed`]), and writes back through a Lua script
//! only if none changed; invalidation bumps them (and deletes the entry) in one MULTI. An entry
//! also records the tag versions it was read under; a lookup whose tags have moved on treats it
//! as a miss. Whichever order reads and writes run in, no invalidated row is served.
//!
//! Redis down: reads bypass the cache. An invalidation that cannot reach Redis is kept in
//! memory and retried in the background; until it succeeds this sidecar serves no read from
//! Redis, so no read after an acknowledged write can see the old value through this sidecar.

use crate::pools::Pools;
use ferry_shared::api::{InvalidationStatus, Row};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes back only if no invalidation happened since the read observed the versions.
/// KEYS[1] entry, KEYS[2] key version, KEYS[3..] tag versions; ARGV[1] key version seen,
/// ARGV[2] value, ARGV[3] Redis TTL in seconds, ARGV[4..] tag versions seen.
const WRITE_BACK: &str = r"
if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[1] then return 0 end
for i = 3, #KEYS do
  if (redis.call('GET', KEYS[i]) or '0') ~= ARGV[i + 1] then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
";

/// Prefix of hash-named entries; caller-chosen keys may not start with it.
pub const HASH_KEY_PREFIX: &str = "sha256:";

/// A cached result as stored in Redis.
#[derive(Serialize, Deserialize)]
struct Entry {
    /// Unix ms when the rows were read from Postgres.
    at_ms: u64,
    /// Fresh for this long after `at_ms`.
    ttl_ms: u64,
    /// Then served stale while revalidating for this long.
    #[serde(default)]
    swr_ms: u64,
    /// Kept for stale-if-error this long after the TTL.
    #[serde(default)]
    sie_ms: u64,
    /// Tag -> tag version when the rows were read.
    #[serde(default)]
    tags: BTreeMap<String, String>,
    rows: Vec<Row>,
}

/// How long an entry lives and what it is tagged with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryPolicy {
    pub ttl_s: u64,
    pub swr_s: u64,
    pub stale_if_error_s: u64,
}

/// Versions a read saw before it went to Postgres; its write-back is conditional on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    version: String,
    tags: BTreeMap<String, String>,
}

/// One lookup to make: the entry's key and the tags the read carries.
pub struct Probe<'a> {
    pub key: &'a str,
    pub tags: &'a [String],
}

pub enum Lookup {
    /// Fresh in Redis.
    Hit {
        rows: Vec<Row>,
        age_ms: u64,
        observed: Observed,
    },
    /// Past its TTL, within stale-while-revalidate: serve it and refresh in the background.
    Revalidate {
        rows: Vec<Row>,
        age_ms: u64,
        observed: Observed,
    },
    /// Not usable as is; `stale` is an old copy allowed for stale-if-error.
    Miss {
        observed: Observed,
        stale: Option<(Vec<Row>, u64)>,
    },
    /// Redis unavailable, or invalidations pending: do not use the cache for this read.
    Bypass,
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
    /// How long a key version outlives its last bump, in seconds. It must outlast the longest
    /// read in flight (bounded by the request timeout), or that read could write back.
    version_ttl_s: u64,
    /// Entries larger than this are not written.
    max_entry_bytes: usize,
    /// Keys and tags whose invalidation could not reach Redis yet.
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    keys: BTreeSet<String>,
    tags: BTreeSet<String>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn text(v: Option<Vec<u8>>) -> String {
    v.and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| "0".into())
}

impl Cache {
    pub fn new(prefix: &str, request_timeout_s: u64, max_entry_bytes: usize) -> Self {
        Cache {
            prefix: prefix.to_string(),
            version_ttl_s: (request_timeout_s * 10).max(3600),
            max_entry_bytes,
            pending: Mutex::new(Pending::default()),
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

    fn tag_key(&self, tag: &str) -> String {
        format!("{}t:{tag}", self.prefix)
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
        let pending = self.pending();
        pools.redis_available() && pending.keys.is_empty() && pending.tags.is_empty()
    }

    /// Looks up many entries in one Redis round trip (two when an entry carries tags the
    /// read did not name). Answers in the order of `probes`.
    pub fn lookup_many(&self, pools: &Pools, probes: &[Probe<'_>]) -> Vec<Lookup> {
        let bypass = || probes.iter().map(|_| Lookup::Bypass).collect();
        if probes.is_empty() || !self.usable(pools) {
            return bypass();
        }
        // redis_conn trips the breaker itself when it fails.
        let Ok(mut conn) = pools.redis_conn() else {
            return bypass();
        };
        let mut pipe = redis::pipe();
        let mut tag_names: BTreeSet<&str> = BTreeSet::new();
        for p in probes {
            pipe.get(self.entry_key(p.key)).get(self.version_key(p.key));
            tag_names.extend(p.tags.iter().map(String::as_str));
        }
        let tag_names: Vec<&str> = tag_names.into_iter().collect();
        for t in &tag_names {
            pipe.get(self.tag_key(t));
        }
        let values: Vec<Option<Vec<u8>>> = match pipe.query(&mut *conn) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "redis lookup failed; serving from postgres");
                pools.mark_redis_failed();
                return bypass();
            }
        };
        let mut values = values.into_iter();
        let mut found: Vec<(Option<Entry>, String)> = Vec::with_capacity(probes.len());
        for _ in probes {
            let entry = values
                .next()
                .flatten()
                .and_then(|b| serde_json::from_slice::<Entry>(&b).ok());
            found.push((entry, text(values.next().flatten())));
        }
        let mut tag_versions: BTreeMap<String, String> = tag_names
            .iter()
            .map(|t| (t.to_string(), text(values.next().flatten())))
            .collect();
        // Tags an entry carries that no read named: one more round trip, rarely needed.
        let unknown: BTreeSet<String> = found
            .iter()
            .filter_map(|(e, _)| e.as_ref())
            .flat_map(|e| e.tags.keys())
            .filter(|t| !tag_versions.contains_key(*t))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            let mut pipe = redis::pipe();
            for t in &unknown {
                pipe.get(self.tag_key(t));
            }
            match pipe.query::<Vec<Option<Vec<u8>>>>(&mut *conn) {
                Ok(vs) => tag_versions.extend(unknown.into_iter().zip(vs.into_iter().map(text))),
                Err(e) => {
                    tracing::warn!(error = %e, "redis lookup failed; serving from postgres");
                    pools.mark_redis_failed();
                    return bypass();
                }
            }
        }
        let now = now_ms();
        probes
            .iter()
            .zip(found)
            .map(|(p, (entry, version))| {
                let observed = Observed {
                    version,
                    tags: p
                        .tags
                        .iter()
                        .map(|t| (t.clone(), tag_versions.get(t).cloned().unwrap_or_default()))
                        .collect(),
                };
                classify(entry, observed, p.tags, &tag_versions, now)
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
                .arg(self.entry_key(key))
                .arg(self.version_key(key));
            for t in observed.tags.keys() {
                c.arg(self.tag_key(t));
            }
            c.arg(&observed.version).arg(value).arg(redis_ttl);
            for v in observed.tags.values() {
                c.arg(v);
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
        match self.try_invalidate(pools, keys, tags) {
            Ok(()) => InvalidationStatus::Done,
            Err(e) => {
                tracing::warn!(error = %e, keys = keys.len(), tags = tags.len(), "invalidation deferred: redis unavailable");
                pools.mark_redis_failed();
                let mut pending = self.pending();
                pending.keys.extend(keys.iter().cloned());
                pending.tags.extend(tags.iter().cloned());
                InvalidationStatus::Deferred
            }
        }
    }

    fn try_invalidate(
        &self,
        pools: &Pools,
        keys: &[String],
        tags: &[String],
    ) -> Result<(), String> {
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
        for t in tags {
            pipe.incr(self.tag_key(t), 1).ignore();
        }
        pipe.query::<()>(&mut *conn).map_err(|e| e.to_string())
    }

    /// Retries pending invalidations; called periodically in the background.
    pub fn flush_pending(&self, pools: &Pools) {
        let (keys, tags): (Vec<String>, Vec<String>) = {
            let p = self.pending();
            (
                p.keys.iter().cloned().collect(),
                p.tags.iter().cloned().collect(),
            )
        };
        if keys.is_empty() && tags.is_empty() {
            return;
        }
        match self.try_invalidate(pools, &keys, &tags) {
            Ok(()) => {
                let mut pending = self.pending();
                for k in &keys {
                    pending.keys.remove(k);
                }
                for t in &tags {
                    pending.tags.remove(t);
                }
                tracing::info!(
                    keys = keys.len(),
                    tags = tags.len(),
                    "deferred invalidations applied"
                );
            }
            Err(e) => tracing::debug!(error = %e, "deferred invalidations still waiting for redis"),
        }
    }

    pub fn pending_count(&self) -> usize {
        let p = self.pending();
        p.keys.len() + p.tags.len()
    }
}

/// Decides what a found entry is worth now.
fn classify(
    entry: Option<Entry>,
    observed: Observed,
    read_tags: &[String],
    current: &BTreeMap<String, String>,
    now: u64,
) -> Lookup {
    let Some(e) = entry else {
        return Lookup::Miss {
            observed,
            stale: None,
        };
    };
    // Valid only if it carries every tag the read names, each still at the version it was
    // read under: otherwise a tag invalidation has passed it by.
    let valid = read_tags.iter().all(|t| e.tags.contains_key(t))
        && e.tags
            .iter()
            .all(|(t, v)| current.get(t).is_some_and(|cur| cur == v));
    if !valid {
        return Lookup::Miss {
            observed,
            stale: None,
        };
    }
    let age_ms = now.saturating_sub(e.at_ms);
    if age_ms < e.ttl_ms {
        Lookup::Hit {
            rows: e.rows,
            age_ms,
            observed,
        }
    } else if age_ms < e.ttl_ms + e.swr_ms {
        Lookup::Revalidate {
            rows: e.rows,
            age_ms,
            observed,
        }
    } else {
        let stale = (age_ms < e.ttl_ms + e.sie_ms).then_some((e.rows, age_ms));
        Lookup::Miss { observed, stale }
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

    fn entry(age_ms: u64, tags: &[(&str, &str)]) -> Entry {
        Entry {
            at_ms: 1_000_000 - age_ms,
            ttl_ms: 10_000,
            swr_ms: 5_000,
            sie_ms: 20_000,
            tags: tags
                .iter()
                .map(|(t, v)| (t.to_string(), v.to_string()))
                .collect(),
            rows: vec![],
        }
    }

    fn current(tags: &[(&str, &str)]) -> BTreeMap<String, String> {
        tags.iter()
            .map(|(t, v)| (t.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn classification_by_age() {
        let now = 1_000_000;
        let cur = current(&[]);
        let o = Observed::default;
        assert!(matches!(
            classify(Some(entry(1, &[])), o(), &[], &cur, now),
            Lookup::Hit { .. }
        ));
        assert!(matches!(
            classify(Some(entry(12_000, &[])), o(), &[], &cur, now),
            Lookup::Revalidate { .. }
        ));
        assert!(matches!(
            classify(Some(entry(16_000, &[])), o(), &[], &cur, now),
            Lookup::Miss { stale: Some(_), .. }
        ));
        assert!(matches!(
            classify(Some(entry(31_000, &[])), o(), &[], &cur, now),
            Lookup::Miss { stale: None, .. }
        ));
    }

    #[test]
    fn moved_tags_invalidate() {
        let now = 1_000_000;
        let tags = vec!["items".to_string()];
        let fresh = || entry(1, &[("items", "3")]);
        let o = Observed::default;
        assert!(matches!(
            classify(Some(fresh()), o(), &tags, &current(&[("items", "3")]), now),
            Lookup::Hit { .. }
        ));
        // The tag moved on: a miss, and no stale copy either (it was invalidated).
        assert!(matches!(
            classify(Some(fresh()), o(), &tags, &current(&[("items", "4")]), now),
            Lookup::Miss { stale: None, .. }
        ));
        // The read names a tag the entry was not stored under: not trusted.
        let more = vec!["items".to_string(), "users".to_string()];
        assert!(matches!(
            classify(
                Some(fresh()),
                o(),
                &more,
                &current(&[("items", "3"), ("users", "0")]),
                now
            ),
            Lookup::Miss { .. }
        ));
    }
}

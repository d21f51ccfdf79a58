//! The read-through query cache in Redis, and invalidation that a racing read cannot undo.
//!
//! Keys (all under `cache.key_prefix`, default `ferry:`):
//! - `q:<key>#<fingerprint>`: a cached result, JSON `Entry`. `<key>` is the caller's
//!   `cache.key`, `<keyspace>:<id>`, or `~val:<schema.table>.<column>:<value>` for an inferred
//!   read by a value (`value_key`), and the fingerprint is a hash of the statement and its
//!   parameters, so another statement under the same key is stored apart and never served in
//!   its place. Without a caller's key the entry is `q:sha256:<hash of statement and params>`.
//! - `v:<key>`: the key's version, a random token replaced by every invalidation of the key
//!   that finds one (a key with no version has no entry and no read in flight).
//! - `{changes}:fresh`, `{changes}:fresh_at`, `{changes}:fresh_rows`: the change stream's
//!   watermark (`freshness.rs`).
//! - `t:<tag>`: a tag's version, a random token replaced by every invalidation of the tag.
//!   An entry that depends on other keys' rows too carries their `v:<key>` as tags
//!   (`key_tag`), which live as long as its entries, as its own key's does.
//! - `tbl:`, `tblr:`, `tblva:`, `tbladd:<schema.table>`, `tblv:` and
//!   `tblm:<schema.table.column>`: the versions of the tags derived from a table (`table_tag`,
//!   `table_reset_tag`, `table_values_tag`, `added_tag`, `values_tag`, `moved_tag`), moved by
//!   the change stream (`changes/`).
//! - `epoch`: the cache-wide version every entry carries (moved when invalidations that waited
//!   for Redis overflowed their bound: everything is invalid at once).
//! - `k:<key>`: plain cache command keys (see `commands.rs`), a namespace of their own.
//!
//! An entry records the versions it was read under and is valid only while all are current.
//! Versions are random and never reused, and a missing one (evicted, expired) matches no entry,
//! so no eviction can make an invalidated entry valid again. A key's version lives at least as
//! long as the entries written under it; one a lookup made lives only as long as a read can be
//! in flight, so lookups of keys nobody writes (made-up ids) leave nothing lasting in Redis.
//! Empty results live at most `cache.negative_ttl_s`.
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

mod answer_rows;
pub(crate) mod commands;
mod durable;
mod entry;
mod freshness;
mod invalidate;
mod known;
mod lookup;
mod names;
mod pending;
mod rows;
mod write;

pub(crate) use answer_rows::Rows;
pub(crate) use entry::Lookup;
pub(crate) use freshness::{Freshness, StreamState};
pub(crate) use names::{
    added_tag, guard_tag, key_tag, legacy_row_key, moved_tag, table_reset_tag, table_tag,
    table_values_tag, value_key, values_tag, VALUES_EPOCH_TAG,
};
use names::{ADDED_TAG, EPOCH_TAG, GUARD_TAG, KEY_TAG, MOVED_TAG};
use names::{TABLE_RESET_TAG, TABLE_TAG, TABLE_VALUES_TAG, VALUES_TAG};

use crate::store::pools::Pools;
use entry::{classify, Entry};
use pending::Pending;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Prefix of hash-named entries; caller-chosen keys may not start with it.
pub(crate) const HASH_KEY_PREFIX: &str = "sha256:";

/// Pending invalidations applied per MULTI, so a long outage's backlog never makes one
/// transaction too large to finish within Redis' timeouts.
const FLUSH_CHUNK: usize = 500;

/// How long an entry lives and what it is tagged with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EntryPolicy {
    pub ttl_s: u64,
    pub swr_s: u64,
    pub stale_if_error_s: u64,
}

/// What a read saw before it went to Postgres; its write-back is conditional on it. Every
/// version is a real token: the lookup creates the ones that did not exist, so "absent" is
/// never a version a write-back can match after an eviction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// The Redis key of the entry (key and statement fingerprint).
    entry_key: String,
    version: String,
    tags: BTreeMap<String, String>,
}

impl Observed {
    /// The versions seen, as one string: two lookups give the same one only if no invalidation
    /// (through any sidecar, or the change stream) moved a version between them.
    pub(crate) fn seen(&self) -> String {
        let mut out = self.version.clone();
        for (tag, token) in &self.tags {
            out.push('\n');
            out.push_str(tag);
            out.push('=');
            out.push_str(token);
        }
        out
    }
}

/// One lookup to make: the entry's key, its statement's fingerprint, the tags the read carries.
pub(crate) struct Probe<'a> {
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub tags: &'a [String],
}

/// What a write-back did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    Written,
    /// Larger than `cache.max_entry_bytes`: answered but not cached.
    TooLarge,
    /// Redis unavailable, or an invalidation ran since the read observed the versions.
    NotWritten,
}

pub(crate) struct Cache {
    prefix: String,
    /// How long a key version outlives its last replacement, in seconds. It must outlast the
    /// longest read in flight (bounded by the request timeout), or that read could write back.
    version_ttl_s: u64,
    /// How long a version a lookup made lives, in seconds: the longest read in flight. A
    /// write-back keeps it as long as its entry; nobody else needs it. So a lookup of a key
    /// nobody wrote (a flood of made-up ids) leaves nothing behind for long.
    flight_ttl_s: u64,
    /// An empty result is kept at most this long, in seconds (`cache.negative_ttl_s`).
    negative_ttl_s: u64,
    /// Entries larger than this are not written.
    max_entry_bytes: usize,
    /// Keys and tags whose invalidation could not reach Redis yet.
    pending: Mutex<Pending>,
    /// The change stream's gate (off unless `[changes]` is on).
    freshness: Freshness,
    /// Where deferred invalidations are also kept (`cache.deferred_table`; `durable`).
    deferred_table: Option<String>,
    /// Whether that table has been seen to exist (`durable`: until then it is asked about,
    /// not read).
    deferred_table_seen: std::sync::atomic::AtomicBool,
    /// On a Redis Cluster: keys carry hash tags, and invalidations wait for this many
    /// replicas, this many milliseconds at most (`redis.cluster_wait_*`).
    cluster: Option<(u32, u64)>,
    /// The row keys of top-N entries this sidecar filled (`rows.rs`).
    rows_seen: rows::RowsSeen,
    /// Entries lately seen in Redis (`known.rs`): whether a read is guessed to miss.
    known: known::Known,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh version token: 128 random bits, never reused in practice.
/// Feeds what is written to a hash (for serde_json::to_writer; it never fails).
struct Hashing<'a>(&'a mut Sha256);

impl std::io::Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// 128 random bits as 32 hex digits (what `{:032x}` writes, without the formatter).
fn token() -> String {
    hex_string(&rand::random::<u128>().to_be_bytes())
}

/// Lower-case hex of `bytes`, written into the string's one allocation (`hex::encode` collects
/// it char by char, a third of a hit's fingerprint under callgrind).
fn hex_string(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    let _ = hex::encode_to_slice(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

impl Cache {
    pub(crate) fn new(
        prefix: &str,
        request_timeout_s: u64,
        max_entry_bytes: usize,
        max_pending: usize,
    ) -> Self {
        Cache {
            prefix: prefix.to_string(),
            version_ttl_s: (request_timeout_s * 10).max(3600),
            flight_ttl_s: request_timeout_s + 5,
            negative_ttl_s: 10,
            max_entry_bytes,
            pending: Mutex::new(Pending::new(max_pending)),
            freshness: Freshness::default(),
            deferred_table: None,
            deferred_table_seen: Default::default(),
            cluster: None,
            rows_seen: rows::RowsSeen::default(),
            known: known::Known::default(),
        }
    }

    /// Empty results are kept at most `s` seconds (`cache.negative_ttl_s`).
    pub(crate) fn negative_ttl(mut self, s: u64) -> Cache {
        self.negative_ttl_s = s;
        self
    }

    /// Keys for a Redis Cluster (see `slot_tag`), and invalidations that wait for replicas.
    pub(crate) fn on_cluster(mut self, wait_replicas: u32, wait_ms: u64) -> Cache {
        self.cluster = Some((wait_replicas, wait_ms));
        self
    }

    /// On a cluster, what keeps a key's entries and its version in one slot (the write-back
    /// script reads both): a hash tag made of a digest of the key, since the key itself may
    /// hold braces. Tags get none: each lives in a slot of its own (ARCHITECTURE.md).
    fn slot_tag(&self, logical: &str) -> String {
        match self.cluster {
            None => String::new(),
            Some(_) => format!(
                "{{{}}}",
                hex::encode(&Sha256::digest(logical.as_bytes())[..8])
            ),
        }
    }

    /// The hash of a statement and its parameters (hex SHA-256).
    pub(crate) fn fingerprint(sql: &str, params: &[Value]) -> String {
        Cache::fingerprint_in(&[], sql, params)
    }

    /// The hash of a statement and its parameters within a scope: who it ran as, and in
    /// what output format. Each part goes in with its length first, so no statement text can
    /// make one read hash as a read of another scope.
    pub(crate) fn fingerprint_in(scope: &[&str], sql: &str, params: &[Value]) -> String {
        let mut h = Sha256::new();
        h.update((scope.len() as u64).to_le_bytes());
        for part in scope.iter().copied().chain([sql]) {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        // serde_json writes a Value the same way every time (object keys sorted); a slice
        // serializes as the array of its values, written straight into the hash.
        let _ = serde_json::to_writer(Hashing(&mut h), params);
        hex_string(&h.finalize())
    }

    /// The entry's key as callers name it: theirs, or `sha256:` and the fingerprint.
    pub(crate) fn logical_key(fingerprint: &str, explicit: Option<&str>) -> String {
        match explicit {
            Some(k) => k.to_string(),
            None => format!("{HASH_KEY_PREFIX}{fingerprint}"),
        }
    }

    fn entry_key(&self, logical: &str, fingerprint: &str) -> String {
        let at = self.slot_tag(logical);
        if logical.starts_with(HASH_KEY_PREFIX) {
            format!("{}{at}q:{logical}", self.prefix)
        } else {
            // 128 bits of the fingerprint tell statements apart under one caller's key.
            let fp = fingerprint.get(..32).unwrap_or(fingerprint);
            format!("{}{at}q:{logical}#{fp}", self.prefix)
        }
    }

    /// The one entry of a hash-named key (`sha256:…`), deleted with its version.
    fn hashed_entry_key(&self, logical: &str) -> String {
        format!("{}{}q:{logical}", self.prefix, self.slot_tag(logical))
    }

    fn version_key(&self, logical: &str) -> String {
        format!("{}{}v:{logical}", self.prefix, self.slot_tag(logical))
    }

    fn tag_key(&self, tag: &str) -> String {
        if tag == EPOCH_TAG {
            format!("{}epoch", self.prefix)
        } else if let Some(t) = tag.strip_prefix(TABLE_TAG) {
            format!("{}tbl:{t}", self.prefix)
        } else if let Some(t) = tag.strip_prefix(TABLE_RESET_TAG) {
            format!("{}tblr:{t}", self.prefix)
        } else if let Some(c) = tag.strip_prefix(VALUES_TAG) {
            format!("{}tblv:{c}", self.prefix)
        } else if let Some(t) = tag.strip_prefix(TABLE_VALUES_TAG) {
            format!("{}tblva:{t}", self.prefix)
        } else if let Some(k) = tag.strip_prefix(KEY_TAG) {
            self.version_key(k)
        } else if let Some(t) = tag.strip_prefix(ADDED_TAG) {
            format!("{}tbladd:{t}", self.prefix)
        } else if let Some(c) = tag.strip_prefix(MOVED_TAG) {
            format!("{}tblm:{c}", self.prefix)
        } else if let Some(t) = tag.strip_prefix(GUARD_TAG) {
            self.tag_key(t)
        } else {
            format!("{}t:{tag}", self.prefix)
        }
    }

    pub(crate) fn plain_key(&self, key: &str) -> String {
        format!("{}k:{key}", self.prefix)
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        // A poisoned lock still holds a valid set; losing pending keys would be worse.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether reads may use Redis right now: it is up (or due a probe, which `send` claims
    /// for one caller), no invalidation waits for it, and the change stream (when on) has
    /// caught up within its bound.
    pub(crate) fn usable(&self, pools: &Pools) -> bool {
        pools.redis_due() && self.pending().is_empty() && self.freshness.serves()
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
        // A scope is never spelled by statement text.
        let scoped = Cache::fingerprint_in(&["as", "alice"], "select $1", &[json!(1)]);
        assert_ne!(a, scoped);
        assert_ne!(
            scoped,
            Cache::fingerprint_in(&["as"], "alice\u{0}select $1", &[json!(1)])
        );
        assert!(Cache::logical_key(&a, None).starts_with(HASH_KEY_PREFIX));
        assert_eq!(Cache::logical_key(&a, Some("item:1")), "item:1");
    }

    #[test]
    fn tokens_are_32_lowercase_hex_digits_and_fresh() {
        let (a, b) = (token(), token());
        assert_ne!(a, b);
        for t in [a, b] {
            assert_eq!(t.len(), 32, "{t}");
            assert!(
                t.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
                "{t}"
            );
        }
    }

    #[test]
    fn fingerprints_do_not_change_across_versions() {
        // Pinned: sidecars of two versions share one Redis during a rolling deploy, and a
        // fingerprint that changed would orphan every entry.
        let params = [
            json!(1),
            json!("x\u{e9}\"y"),
            json!({"b": [1.5, null], "a": true}),
        ];
        assert_eq!(
            Cache::fingerprint_in(&["as", "alice"], "select $1, $2, $3", &params),
            "2dc8646e1ec4fc845af0aa610d23d6542adbf02f6a7d38f1a997b0bf6568bda3"
        );
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

//! Top-N reads (`store::postgres::top_n`): what their entries depend on, the keys of the rows
//! they returned, is known only after Postgres answers. A fill reads those keys' versions
//! after its query ([`Cache::observe_keys`]) and writes back only if none moved since, nor its
//! table's tag since its lookup (a `guard_tag`). A lookup must name them before it is sent:
//! the sidecar remembers, per entry, the keys its last fill found ([`Cache::rows_seen`]); a
//! lookup without them (another sidecar filled the entry, or this one restarted) is a miss,
//! whose fill remembers them.

use super::{key_tag, token, Cache, Observed, KEY_TAG};
use crate::store::blocking::Blocking;
use crate::store::pools::send::{send, How};
use crate::store::pools::Pools;
use redis::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The entries remembered at most: past it all are forgotten (each then costs one miss).
const MAX_REMEMBERED: usize = 10_000;

/// The row keys of top-N entries, by entry (key and fingerprint).
#[derive(Default)]
pub(super) struct RowsSeen(Mutex<HashMap<String, Vec<String>>>);

impl Cache {
    /// Whether reads may depend on their rows here: not on a cluster, where a write-back's
    /// script cannot check a guard in another slot.
    pub(crate) fn rows_kept(&self) -> bool {
        self.cluster.is_none()
    }

    /// The key tags of the rows the last fill of this entry returned (none if unknown).
    pub(crate) fn rows_seen(&self, key: &str, fingerprint: &str) -> Vec<String> {
        let seen = self.rows_seen.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(&self.entry_key(key, fingerprint))
            .map(|keys| keys.iter().map(|k| key_tag(k)).collect())
            .unwrap_or_default()
    }

    /// Remembers the row keys a fill of this entry wrote it under.
    pub(crate) fn remember_rows(&self, key: &str, fingerprint: &str, keys: Vec<String>) {
        let mut seen = self.rows_seen.0.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= MAX_REMEMBERED {
            seen.clear();
        }
        seen.insert(self.entry_key(key, fingerprint), keys);
    }

    /// After a read whose rows name what it depends on (a top-N read: the keys of the rows it
    /// returned): the versions of `keys`, read or made for a flight as a lookup makes them,
    /// added to what the read observed as key tags. Its write-back then stores the entry only
    /// if none moved since, nor its guard (its table's tag) since the lookup. False when Redis
    /// could not be asked: the fill then writes nothing back.
    pub(crate) async fn observe_keys(
        &self,
        (pools, blocking): (&Arc<Pools>, &Blocking),
        observed: &mut Observed,
        keys: &[String],
    ) -> bool {
        // The rows of this run replace those a lookup named from an earlier fill.
        observed.tags.retain(|t, _| !t.starts_with(KEY_TAG));
        if keys.is_empty() {
            return true;
        }
        let mut pipe = redis::pipe();
        let mine: Vec<String> = keys.iter().map(|_| token()).collect();
        for (k, t) in keys.iter().zip(&mine) {
            pipe.cmd("SET")
                .arg(self.version_key(k))
                .arg(t)
                .arg("NX")
                .arg("GET")
                .arg("EX")
                .arg(self.flight_ttl_s);
        }
        let how = How {
            each: false,
            again: true,
        };
        let Ok(Ok(v)) = send(pools, blocking, &pipe, how).await else {
            return false;
        };
        let Ok(values) = redis::from_redis_value::<Vec<Option<String>>>(Value::Array(v)) else {
            return false;
        };
        for ((k, seen), t) in keys.iter().zip(values).zip(mine) {
            observed.tags.insert(key_tag(k), seen.unwrap_or(t));
        }
        true
    }
}

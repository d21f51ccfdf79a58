//! Write-backs: a result stored only if no version moved since the read observed them.

use super::{now_ms, Cache, Entry, EntryPolicy, Observed, Stored, GUARD_TAG, KEY_TAG};
use crate::store::blocking::Blocking;
use crate::store::pools::send::{send, How};
use crate::store::pools::Pools;
use ferry_shared::api::Row;
use redis::Value;
use std::sync::Arc;

/// Writes back only if no version moved since the read observed them. KEYS[1] entry,
/// KEYS[2] key version, KEYS[3..] tag versions (the epoch among them), the versions of other
/// keys (`key_tag`) first. ARGV[1] value, ARGV[2] TTL in seconds, ARGV[3] how many of the tags
/// are other keys' versions, ARGV[4] key version seen, ARGV[5..] tag versions seen. A version
/// that went missing (evicted) counts as moved. The keys' versions are kept at least as long
/// as the entry.
const WRITE_BACK: &str = r"
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[i + 2] then return 0 end
end
local ttl = tonumber(ARGV[2])
for i = 2, 2 + tonumber(ARGV[3]) do
  local left = redis.call('TTL', KEYS[i])
  if left >= 0 and left < ttl then redis.call('EXPIRE', KEYS[i], ttl) end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
return 1
";

impl Cache {
    /// A freshly read result's write-back, built (the entry serialized, its size checked) but
    /// not sent: [`WriteBack::too_large`] is known before the answer goes out, and
    /// [`Cache::send_write_back`] sends it after.
    pub(crate) fn prepare_store(
        &self,
        pools: &Pools,
        (key, observed, rows): (&str, &Observed, &[Row]),
        policy: &EntryPolicy,
    ) -> WriteBack {
        self.write_back(pools, &[(key, observed, rows)], policy)
    }

    /// Sends a write-back, which is written unless an invalidation ran since its `observed`
    /// versions were read (on this worker's multiplexed connection when it can: `send`).
    /// Redis failures only cost a future miss, so they are logged, not returned. `behind`:
    /// commands sent after the write-back in its round trip when there is one (on a single
    /// Redis: a fill lease's release); the answer says whether they went and Redis answered.
    pub(crate) async fn send_write_back(
        &self,
        (pools, blocking): (&Arc<Pools>, &Blocking),
        mut w: WriteBack,
        behind: Option<&(dyn Fn(&mut redis::Pipeline) + Sync)>,
    ) -> (Stored, bool) {
        if w.sent.is_empty() {
            return (w.written[0], false);
        }
        let behind = behind.filter(|_| self.cluster.is_none());
        if let Some(add) = behind {
            add(&mut w.pipe);
        }
        // Conditional writes: a second run writes nothing the first did not.
        let how = How {
            each: false,
            again: true,
        };
        // A failure to connect has tripped the breaker: nothing was written.
        let Ok(sent) = send(pools, blocking, &w.pipe, how).await else {
            return (Stored::NotWritten, false);
        };
        let result: redis::RedisResult<Vec<i64>> =
            sent.and_then(|v| redis::from_redis_value(Value::Array(v)).map_err(Into::into));
        let sent_behind = behind.is_some() && result.is_ok();
        (w.finish(pools, result)[0], sent_behind)
    }

    /// The write-back pipeline of `items`: one conditional EVAL per entry that fits.
    fn write_back(
        &self,
        pools: &Pools,
        items: &[(&str, &Observed, &[Row])],
        policy: &EntryPolicy,
    ) -> WriteBack {
        let mut w = WriteBack {
            pipe: redis::pipe(),
            sent: Vec::new(),
            written: vec![Stored::NotWritten; items.len()],
        };
        if items.is_empty() || !self.usable(pools) {
            return w;
        }
        for (i, (key, observed, rows)) in items.iter().enumerate() {
            // An empty result (an id nobody wrote, say) is kept briefly, with no grace: a
            // flood of made-up ids cannot fill Redis for the entries' full lifetime.
            let p = if rows.is_empty() {
                EntryPolicy {
                    ttl_s: policy.ttl_s.min(self.negative_ttl_s).max(1),
                    swr_s: 0,
                    stale_if_error_s: 0,
                }
            } else {
                policy.clone()
            };
            let redis_ttl = p.ttl_s + p.swr_s.max(p.stale_if_error_s);
            let entry = Entry {
                at_ms: now_ms(),
                ttl_ms: p.ttl_s * 1000,
                swr_ms: p.swr_s * 1000,
                sie_ms: p.stale_if_error_s * 1000,
                ver: observed.version.clone(),
                // A guard is checked below, not carried.
                tags: observed
                    .tags
                    .iter()
                    .filter(|(t, _)| !t.starts_with(GUARD_TAG))
                    .map(|(t, v)| (t.clone(), v.clone()))
                    .collect(),
                rows: *rows,
            };
            let Ok(value) = serde_json::to_string(&entry) else {
                continue;
            };
            if value.len() > self.max_entry_bytes {
                w.written[i] = Stored::TooLarge;
                continue;
            }
            // On a cluster the tags live in other slots than the entry, out of the script's
            // reach: the lookup's own comparison of the tokens the entry records against the
            // tokens now keeps an entry written under a moved tag from being served.
            // (On a cluster, other keys' versions are not kept longer than a flight: such an
            // entry is found valid only while they last.)
            let (keys, tags): (Vec<_>, Vec<_>) = match self.cluster {
                Some(_) => Default::default(),
                None => observed
                    .tags
                    .iter()
                    .partition(|(t, _)| t.starts_with(KEY_TAG)),
            };
            let c = w
                .pipe
                .cmd("EVAL")
                .arg(WRITE_BACK)
                .arg(2 + keys.len() + tags.len())
                .arg(&observed.entry_key)
                .arg(self.version_key(key));
            for (t, _) in keys.iter().chain(&tags) {
                c.arg(self.tag_key(t));
            }
            c.arg(value)
                .arg(redis_ttl)
                .arg(keys.len())
                .arg(&observed.version);
            for (_, seen) in keys.iter().chain(&tags) {
                c.arg(seen);
            }
            w.sent.push(i);
        }
        w
    }
}

/// A write-back pipeline, which of the items it carries, and what became of each.
pub(crate) struct WriteBack {
    pipe: redis::Pipeline,
    sent: Vec<usize>,
    written: Vec<Stored>,
}

impl WriteBack {
    /// Whether the (first) entry was too large to be written: known once built.
    pub(crate) fn too_large(&self) -> bool {
        self.written.first() == Some(&Stored::TooLarge)
    }

    /// Each item's outcome from the scripts' answers; a Redis failure trips the breaker.
    fn finish(self, pools: &Pools, result: redis::RedisResult<Vec<i64>>) -> Vec<Stored> {
        let mut written = self.written;
        match result {
            Ok(flags) => {
                for (i, flag) in self.sent.into_iter().zip(flags) {
                    if flag == 1 {
                        written[i] = Stored::Written;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "redis write-back failed");
                pools.redis_failed(&e);
            }
        }
        written
    }
}

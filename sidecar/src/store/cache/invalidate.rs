//! Invalidation after a write, and the deferred ones applied once Redis is back.

use super::pending::Chunk;
use super::{token, Cache, EPOCH_TAG, FLUSH_CHUNK};
use crate::store::pools::Pools;
use ferry_shared::api::InvalidationStatus;

impl Cache {
    /// Invalidates entries by key and by tag after a write committed. If Redis cannot be
    /// reached they are kept and retried (see the module docs), and the answer says `deferred`.
    pub(crate) fn invalidate(
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
                self.persist_deferred(pools, keys, tags);
                InvalidationStatus::Deferred
            }
        }
    }

    /// Replaces the versions of the chunk's keys and tags (and the epoch): in one MULTI on a
    /// single server. On a cluster they live in many slots, so each moves on its own (each
    /// alone keeps the entries recorded under it from being served), and the chunk is done
    /// once the master of every slot touched has passed it to `redis.cluster_wait_replicas`.
    pub(super) fn try_invalidate(&self, pools: &Pools, chunk: &Chunk) -> Result<(), String> {
        let mut conn = pools.redis_conn().map_err(|e| e.to_string())?;
        let (pipe, moved) = self.invalidation_pipe(chunk);
        if let Err(e) = conn.query_pipe::<Vec<redis::Value>>(&pipe) {
            if !crate::store::redis::connection_lost(&e) {
                return Err(e.to_string());
            }
            // Redis ended the connection: once more on a fresh one (fresh tokens make a
            // second run harmless).
            pools.redis_failed(&e);
            drop(conn);
            conn = pools.redis_conn().map_err(|e| e.to_string())?;
            conn.query_pipe::<Vec<redis::Value>>(&pipe)
                .map_err(|e| e.to_string())?;
        }
        let Some((replicas, wait_ms)) = self.cluster.filter(|(n, _)| *n > 0) else {
            return Ok(());
        };
        let reached = conn
            .wait_for_replicas(&moved, replicas, wait_ms)
            .map_err(|e| e.to_string())?;
        if reached < i64::from(replicas) {
            return Err(format!(
                "WAIT: {reached} of {replicas} replicas hold the invalidation after {wait_ms} ms"
            ));
        }
        Ok(())
    }

    /// The commands that move a chunk's versions (one MULTI on a single server), and the
    /// version keys they move.
    fn invalidation_pipe(&self, chunk: &Chunk) -> (redis::Pipeline, Vec<String>) {
        let mut pipe = redis::pipe();
        if self.cluster.is_none() {
            pipe.atomic();
        }
        let mut moved = Vec::new();
        for (k, _) in &chunk.keys {
            let version = self.version_key(k);
            // Only a version that exists is replaced: a key with none has no entry and no read
            // in flight (a read's lookup makes one before it goes to Postgres), and a change
            // stream moving a key per changed value must not leave one behind per value.
            pipe.cmd("SET")
                .arg(&version)
                .arg(token())
                .arg("XX")
                .arg("EX")
                .arg(self.version_ttl_s)
                .del(self.hashed_entry_key(k));
            moved.push(version);
        }
        for (t, _) in &chunk.tags {
            moved.push(self.tag_key(t));
        }
        if chunk.everything.is_some() {
            moved.push(self.tag_key(EPOCH_TAG));
        }
        for tag_key in moved.iter().skip(chunk.keys.len()) {
            pipe.set(tag_key, token());
        }
        (pipe, moved)
    }

    /// Invalidates for the change stream, which keeps what failed itself (its position in the
    /// slot is not confirmed until this succeeds): a MULTI per chunk ([`change_chunks`]), one
    /// pipeline write each. Err: nothing is known to
    /// be applied; the caller retries the whole set (applying twice is harmless).
    pub(crate) fn invalidate_changes(
        &self,
        pools: &Pools,
        keys: &[String],
        tags: &[String],
        everything: bool,
    ) -> Result<(), String> {
        for chunk in change_chunks(keys, tags, everything) {
            self.try_invalidate(pools, &chunk)?;
        }
        Ok(())
    }

    /// Applies pending invalidations, a chunk at a time; called periodically in the background.
    pub(crate) fn flush_pending(&self, pools: &Pools) {
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
    pub(crate) fn pending_count(&self) -> usize {
        self.pending().len()
    }
}

/// A round of the change stream as MULTIs: the tags, the epoch and the first `FLUSH_CHUNK` keys
/// together (a usual round, one round trip), then the rest of the keys a `FLUSH_CHUNK` at a
/// time (a MULTI holds Redis while it runs).
fn change_chunks(keys: &[String], tags: &[String], everything: bool) -> Vec<Chunk> {
    let mut parts = keys.chunks(FLUSH_CHUNK);
    let first = Chunk {
        keys: parts
            .next()
            .unwrap_or_default()
            .iter()
            .map(|k| (k.clone(), 0))
            .collect(),
        tags: tags.iter().map(|t| (t.clone(), 0)).collect(),
        everything: everything.then_some(0),
    };
    let rest = parts.map(|part| Chunk {
        keys: part.iter().map(|k| (k.clone(), 0)).collect(),
        ..Default::default()
    });
    std::iter::once(first)
        .filter(|c| !c.is_empty())
        .chain(rest)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize, prefix: &str) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[test]
    fn a_usual_round_is_one_multi_with_its_tags_epoch_and_keys() {
        let chunks = change_chunks(&names(3, "k"), &names(2, "t"), true);
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].keys.len(), 3);
        assert_eq!(chunks[0].tags.len(), 2);
        assert!(chunks[0].everything.is_some());
    }

    #[test]
    fn many_keys_go_a_chunk_at_a_time_and_none_is_lost() {
        let keys = names(2 * FLUSH_CHUNK + 7, "k");
        let chunks = change_chunks(&keys, &names(1, "t"), false);
        assert_eq!(
            chunks.iter().map(|c| c.keys.len()).collect::<Vec<_>>(),
            [FLUSH_CHUNK, FLUSH_CHUNK, 7]
        );
        assert_eq!(chunks[0].tags.len(), 1);
        assert!(chunks[1..].iter().all(|c| c.tags.is_empty()));
        let sent: Vec<&String> = chunks
            .iter()
            .flat_map(|c| c.keys.iter().map(|(k, _)| k))
            .collect();
        assert_eq!(sent, keys.iter().collect::<Vec<_>>());
    }

    #[test]
    fn nothing_to_move_sends_nothing() {
        assert!(change_chunks(&[], &[], false).is_empty());
        assert_eq!(change_chunks(&names(1, "k"), &[], false).len(), 1);
    }
}

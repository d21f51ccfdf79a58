//! Deferred invalidations kept in Postgres (`cache.deferred_table`), so they outlive the
//! sidecar that deferred them and reach Redis through whichever sidecar gets there first.
//!
//! Kept by Ferry's own role (`postgres.owner_url`): a request's SQL can neither add a row
//! (one `everything` row flushes the cache on every sidecar) nor delete one.
//!
//! A write whose invalidation cannot reach Redis is already committed in Postgres, so Postgres
//! is reachable: the keys and tags go into the table there and then, beside the sidecar's own
//! memory (`pending`, which keeps that sidecar's reads off Redis until they are applied). Every
//! sidecar's retry thread looks at the table about once a second; one that can reach Redis
//! applies what it finds, a chunk at a time, and deletes what it applied. Applying one twice is
//! harmless (the versions just move again). Past `limits.max_pending_invalidations` in memory,
//! one `everything` row stands for the rest: its flush moves the cache-wide epoch.

use super::pending::Chunk;
use super::{Cache, FLUSH_CHUNK};
use crate::store::coordination::ferry_tables;
use crate::store::pools::session::{with_owner_read, with_owner_session};
use crate::store::pools::Pools;
use crate::store::postgres::failure::Failure;
use std::sync::atomic::Ordering;

/// The table's columns: `kind` is `k` (a key), `t` (a tag) or `e` (everything).
const COLUMNS: &str = "(id bigserial PRIMARY KEY, kind text NOT NULL, name text NOT NULL, \
                       deferred_at timestamptz NOT NULL DEFAULT now())";

impl Cache {
    /// Keeps deferred invalidations in `table` as well as in memory.
    pub(crate) fn keep_deferred_in(mut self, table: String) -> Cache {
        self.deferred_table = Some(table);
        self
    }

    /// Writes just-deferred keys and tags to the table (one row for everything once memory
    /// is past its bound). A failure is logged: the sidecar's memory still holds them.
    pub(super) fn persist_deferred(&self, pools: &Pools, keys: &[String], tags: &[String]) {
        let Some(table) = &self.deferred_table else {
            return;
        };
        let (keys, tags, everything) = if self.pending().is_everything() {
            (Vec::new(), Vec::new(), true)
        } else {
            (keys.to_vec(), tags.to_vec(), false)
        };
        let kept = with_owner_session(pools, |s| {
            ferry_tables::ensure(s, table, COLUMNS)?;
            let mut tx = s.client.build_transaction().read_only(false).start()?;
            tx.execute(
                &format!(
                    "INSERT INTO {table} (kind, name) \
                     SELECT 'k', unnest($1::text[]) UNION ALL SELECT 't', unnest($2::text[]) \
                     UNION ALL SELECT 'e', '' WHERE $3"
                ),
                &[&keys, &tags, &everything],
            )?;
            tx.commit()?;
            Ok(())
        });
        match kept {
            Ok(()) => self.deferred_table_seen.store(true, Ordering::Relaxed),
            Err(e) => tracing::warn!(error = %e.into_api(),
                "deferred invalidations kept in this sidecar's memory only"),
        }
    }

    /// Applies what the table holds, a chunk at a time, while Redis takes it. Returns how many
    /// rows were applied.
    pub(crate) fn flush_deferred_table(&self, pools: &Pools) -> usize {
        let Some(table) = &self.deferred_table else {
            return 0;
        };
        // No table yet: nothing was ever deferred (the first deferral, on any sidecar, makes
        // it). Postgres is asked whether it exists, which is never DDL and never an error: read
        // while missing, it was one in Postgres's log every second. Nor is the session reset
        // after it (`with_owner_read`): that was a `DISCARD ALL` every second.
        if !self.deferred_table_seen.load(Ordering::Relaxed) {
            let exists = with_owner_read(pools, |s| {
                s.client
                    .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
                    .map(|r| r.get::<_, bool>(0))
                    .map_err(Failure::from)
            });
            match exists {
                Ok(true) => self.deferred_table_seen.store(true, Ordering::Relaxed),
                Ok(false) => return 0,
                Err(e) => {
                    tracing::debug!(error = %e.into_api(), "deferred invalidations table not found");
                    return 0;
                }
            }
        }
        let mut applied = 0;
        loop {
            let rows = with_owner_session(pools, |s| {
                s.client
                    .query(
                        &format!("SELECT id, kind, name FROM {table} ORDER BY id LIMIT $1"),
                        &[&(FLUSH_CHUNK as i64)],
                    )
                    .map_err(Failure::from)
            });
            let rows = match rows {
                Ok(rows) if !rows.is_empty() => rows,
                Ok(_) => return applied,
                Err(Failure::Pg(e))
                    if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) =>
                {
                    // Dropped since: asked about again from the next round.
                    self.deferred_table_seen.store(false, Ordering::Relaxed);
                    return applied;
                }
                Err(e) => {
                    tracing::debug!(error = %e.into_api(), "deferred invalidations table not read");
                    return applied;
                }
            };
            let mut chunk = Chunk::default();
            let mut ids: Vec<i64> = Vec::with_capacity(rows.len());
            for r in &rows {
                ids.push(r.get(0));
                let name: String = r.get(2);
                match r.get::<_, &str>(1) {
                    "k" => chunk.keys.push((name, 0)),
                    "t" => chunk.tags.push((name, 0)),
                    _ => chunk.everything = Some(0),
                }
            }
            if let Err(e) = self.try_invalidate(pools, &chunk) {
                tracing::debug!(error = %e, "deferred invalidations still waiting for redis");
                return applied;
            }
            let deleted = with_owner_session(pools, |s| {
                let mut tx = s.client.build_transaction().read_only(false).start()?;
                tx.execute(&format!("DELETE FROM {table} WHERE id = ANY($1)"), &[&ids])?;
                tx.commit()?;
                Ok(())
            });
            if let Err(e) = deleted {
                // Applied, not deleted: applied again later, which is harmless.
                tracing::debug!(error = %e.into_api(), "applied deferrals not deleted yet");
                return applied;
            }
            applied += ids.len();
            tracing::info!(
                rows = ids.len(),
                "deferred invalidations applied from the table"
            );
        }
    }
}

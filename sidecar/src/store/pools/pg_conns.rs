//! Postgres sessions from the pools: a worker's own on its event loop, or a pooled one watched
//! by its job's deadline (`PgConn`); Ferry's own role's, for its books.

use super::Pools;
use crate::error::ApiError;
use crate::store::postgres::loop_session::AsyncSession;
use crate::store::postgres::PgManager;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A pooled Postgres session, watched by the deadline of the job that holds it
/// (`store::postgres::deadline`): past it, its statement is cancelled and the session closed, not pooled.
pub(crate) struct PgConn {
    inner: r2d2::PooledConnection<PgManager>,
    watched: Option<crate::store::postgres::deadline::Watched>,
}

impl PgConn {
    /// A session just checked out, watched by the current job's deadline.
    pub(crate) fn checked_out(
        inner: r2d2::PooledConnection<PgManager>,
    ) -> Result<PgConn, ApiError> {
        let mut conn = PgConn {
            inner,
            watched: None,
        };
        conn.watch_here()?;
        Ok(conn)
    }

    /// Watched by the current job's deadline from now on (an interactive transaction's
    /// statements each run under their own request's). Err: that deadline has passed.
    pub(crate) fn watch_here(&mut self) -> Result<(), ApiError> {
        self.release();
        match crate::store::postgres::deadline::watch(&self.inner.client, &self.inner.tls) {
            Ok(w) => {
                self.watched = w;
                Ok(())
            }
            Err(crate::store::postgres::deadline::Expired) => {
                // Nothing more runs on it for this job: closed, not pooled.
                self.inner.poisoned = true;
                Err(ApiError::Timeout {
                    what: "the request",
                })
            }
        }
    }

    fn release(&mut self) {
        if let Some(w) = self.watched.take() {
            if w.release() {
                self.inner.poisoned = true;
            }
        }
    }
}

impl std::ops::Deref for PgConn {
    type Target = crate::store::postgres::PgSession;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl std::ops::DerefMut for PgConn {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        // Before the session goes back to the pool, which then closes it if poisoned.
        self.release();
    }
}

impl Pools {
    /// A Postgres session on this worker's event loop, or None: this thread has no share, or
    /// it waited in line for its share past `loop_session::SPILL_AFTER` while the r2d2 pool
    /// has a connection to spare (the caller then uses `pg_conn`, so every connection of
    /// `postgres.pool_size` serves reads). Otherwise it waits for one of its share, up to the
    /// checkout timeout.
    /// `keep_prepared`: for a `skip_reset` run only, which may find its statement prepared.
    pub(crate) async fn pg_session(
        &self,
        keep_prepared: bool,
    ) -> Result<Option<AsyncSession>, ApiError> {
        self.own_sessions.gate()?;
        let pooled_has_room = || {
            self.pg.as_ref().is_some_and(|p| {
                let s = p.state();
                s.idle_connections > 0 || s.connections < self.pg_pooled
            })
        };
        let start = Instant::now();
        let got = self
            .pg_async
            .session(
                self.pg_connect_timeout,
                self.pg_checkout_timeout,
                pooled_has_room,
                keep_prepared,
            )
            .await;
        // Timed like a pooled checkout (waiting for a session of the worker's share included).
        if matches!(got, Ok(Some(_))) {
            crate::metrics::global().checkout("postgres", start.elapsed());
        }
        got
    }

    /// A session of this worker's share, waiting for one up to the checkout timeout (then 503
    /// `overloaded`): for work that needs the async driver (`/sql` streams its text rows).
    /// `role`: a Neon token's `postgres_url`, for a session of its role (None: `postgres.url`).
    pub(crate) async fn pg_session_here(
        &self,
        role: Option<&str>,
    ) -> Result<AsyncSession, ApiError> {
        self.own_sessions.gate()?;
        let sessions = match role {
            None => &self.pg_async,
            Some(url) => self
                .neon
                .get(url)
                .ok_or_else(|| ApiError::internal("a Neon token's role has no sessions"))?,
        };
        let start = Instant::now();
        let got = sessions
            .session(
                self.pg_connect_timeout,
                self.pg_checkout_timeout,
                || false,
                false,
            )
            .await?;
        crate::metrics::global().checkout("postgres", start.elapsed());
        got.ok_or(ApiError::Overloaded {
            what: "postgres sessions (this thread has none)",
        })
    }

    /// A Postgres connection. A timeout with every connection in use is overload (503
    /// `overloaded`); a timeout with free slots means connecting failed (503
    /// `database_unavailable`).
    pub(crate) fn pg_conn(&self) -> Result<PgConn, ApiError> {
        self.pg_conn_keeping(false)
    }

    /// [`Pools::pg_conn`]; `keep_prepared` for a `skip_reset` read only (see `pg_session`).
    pub(crate) fn pg_conn_keeping(&self, keep_prepared: bool) -> Result<PgConn, ApiError> {
        self.own_sessions.gate()?;
        let pool = self
            .pg
            .as_ref()
            .ok_or_else(|| ApiError::internal("postgres pool used after shutdown"))?;
        let m = crate::metrics::global();
        m.pg_waiting.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let got = pool.get();
        m.pg_waiting.fetch_sub(1, Ordering::Relaxed);
        m.checkout("postgres", start.elapsed());
        let mut got = got.map_err(|e| {
            if pool.state().connections >= self.pg_pooled {
                ApiError::Overloaded {
                    what: "postgres pool",
                }
            } else {
                ApiError::DatabaseUnavailable {
                    internal: e.to_string(),
                }
            }
        })?;
        if !keep_prepared {
            // Closed (in order, ahead of what is sent next) before anything else runs here.
            got.prepared.clear();
        }
        PgConn::checked_out(got)
    }

    /// Whether a Neon token's role (its `postgres_url`) has sessions here.
    pub(crate) fn has_neon_role(&self, url: &str) -> bool {
        self.neon.contains_key(url)
    }

    /// Whether Ferry's own role has sessions of its own (`postgres.owner_url`).
    pub(crate) fn has_owner_pool(&self) -> bool {
        self.owner.is_some()
    }

    /// A session of Ferry's own role, for its bookkeeping (`postgres.url`'s pool with
    /// `postgres.single_role`). Not before the sessions were found to be Ferry's own.
    pub(crate) fn owner_conn(&self) -> Result<PgConn, ApiError> {
        let Some(pool) = &self.owner else {
            return self.pg_conn();
        };
        self.own_sessions.gate()?;
        pool.get()
            .map_err(|e| ApiError::DatabaseUnavailable {
                internal: format!("postgres.owner_url: {e}"),
            })
            .and_then(PgConn::checked_out)
    }
}

//! The two bounded r2d2 pools and the Redis circuit breaker.
//!
//! Pools never open more than `pool_size` connections, whatever the load: a request that cannot
//! get one within the checkout timeout is answered 503. Redis failures also trip a short
//! circuit breaker, so that while Redis is down reads go straight to Postgres instead of each
//! paying a connect timeout. `session`: how a request holds a Postgres session from them
//! (checked out, used, reset before anyone else gets it); `redis_lost`: a Redis connection
//! Redis ended while it stays up. The connections themselves are `postgres` and `redis`.

pub mod redis_lost;
pub mod session;

use crate::config::Config;
use crate::error::ApiError;
use crate::store::postgres::loop_session::{AsyncPg, AsyncSession};
use crate::store::postgres::own_sessions::OwnSessions;
use crate::store::postgres::param_types::ParamTypes;
use crate::store::postgres::{pg_async_config, pg_config, pg_tls, PgManager};
use crate::store::redis::{store_client, AsyncConn, AsyncRedis, RedisManager};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type RedisPool = r2d2::Pool<RedisManager>;
pub type PgPool = r2d2::Pool<PgManager>;
/// A pooled Postgres session, watched by the deadline of the job that holds it
/// (`store::postgres::deadline`): past it, its statement is cancelled and the session closed, not pooled.
pub struct PgConn {
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
    pub fn watch_here(&mut self) -> Result<(), ApiError> {
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
pub type RedisConn = r2d2::PooledConnection<RedisManager>;

/// Logs connection failures r2d2 meets while filling a pool (it would otherwise drop them).
#[derive(Debug)]
pub(crate) struct LogErrors(pub &'static str);

impl<E: std::fmt::Display> r2d2::HandleError<E> for LogErrors {
    fn handle_error(&self, error: E) {
        tracing::warn!(pool = self.0, %error, "cannot open connection");
    }
}

pub struct Pools {
    pub redis: RedisPool,
    /// Multiplexed connections, one per worker, for commands run on the event loop.
    redis_async: AsyncRedis,
    /// Always Some until drop (see `Drop for Pools`).
    pub(super) pg: Option<PgPool>,
    /// Ferry's own role's sessions (`postgres.owner_url`), for its bookkeeping only: two at
    /// most, on top of `postgres.pool_size`. None with `postgres.single_role`.
    owner: Option<PgPool>,
    /// The workers' own Postgres sessions, for reads on the event loop.
    pg_async: AsyncPg,
    /// The workers' sessions of each Neon token's own role, by its `postgres_url`
    /// (`sessions_per_worker` each, on top of `postgres.pool_size`).
    neon: std::collections::HashMap<String, AsyncPg>,
    /// Whether Postgres's sessions were found to be Ferry's own: none is used until then.
    pub own_sessions: OwnSessions,
    pg_connect_timeout: Duration,
    pg_checkout_timeout: Duration,
    /// Parameter types of the statements seen, so repeated ones run in one round trip.
    pub param_types: ParamTypes,
    redis_size: u32,
    redis_cluster: bool,
    /// Whether `redis.pool_size` leaves a connection for fill wake-ups.
    wakeups: bool,
    pg_size: u32,
    /// The r2d2 pool's share of `pg_size` (the rest are the workers' sessions).
    pg_pooled: u32,
    /// Milliseconds since `epoch` until which Redis is considered down; 0 while it is up.
    redis_down_until_ms: AtomicU64,
    /// Redis failures so far: connections opened before the latest one are retired.
    redis_generation: Arc<AtomicU64>,
    redis_retry_after_failure: Duration,
    epoch: Instant,
}

impl Pools {
    /// Builds both pools without waiting for Redis or Postgres to answer: the sidecar starts
    /// (and reports not ready) while they are down, and connects when they come up.
    pub fn new(config: &Config) -> Result<Pools, ApiError> {
        let r = &config.redis;
        let client = store_client(r).map_err(ApiError::internal)?;
        let redis_generation = Arc::new(AtomicU64::new(0));
        // redis.pool_size bounds every connection: up to half of it are the workers'
        // multiplexed ones (one per worker), the rest the r2d2 pool's.
        let workers = config.server.worker_count();
        let multiplexed = workers.min(r.pool_size as usize / 2);
        let redis_async = AsyncRedis::new(
            client.clone(),
            Duration::from_millis(r.connect_timeout_ms),
            Duration::from_millis(r.io_timeout_ms),
            multiplexed,
        );
        // One more listens for other sidecars' fills (`store::coordination::leases`), from 3 connections up.
        let wakeups = u32::from(r.pool_size >= 3);
        let pooled = r.pool_size - multiplexed as u32 - wakeups;
        let redis = r2d2::Pool::builder()
            .max_size(pooled)
            .min_idle(Some(r.min_idle.min(pooled)))
            .connection_timeout(Duration::from_millis(r.checkout_timeout_ms))
            // A PING per checkout would double every cache round trip; broken connections are
            // caught by has_broken when they fail instead.
            .test_on_check_out(false)
            .error_handler(Box::new(LogErrors("redis")))
            .build_unchecked(RedisManager {
                client,
                connect_timeout: Duration::from_millis(r.connect_timeout_ms),
                io_timeout: Duration::from_millis(r.io_timeout_ms),
                generation: redis_generation.clone(),
            });
        let p = &config.postgres;
        // postgres.pool_size bounds every connection too: three quarters of it go to the
        // workers' event-loop sessions (an equal share each), the rest to the r2d2 pool (writes,
        // batches, cache fills, and the reads a worker has no free session for).
        let (pg_per_worker, _) = config.pg_split();
        let own_sessions = OwnSessions::for_config(config)?
            .with_audit(crate::store::postgres::roles::Audit::for_config(config));
        let tls = pg_tls(p).map_err(ApiError::internal)?;
        let pg_async = AsyncPg::new(
            pg_async_config(config)?,
            tls.clone(),
            (pg_per_worker, workers),
            own_sessions.opened(),
        );
        let mut neon = std::collections::HashMap::new();
        for t in config
            .neon
            .tokens
            .iter()
            .filter(|t| !t.postgres_url.is_empty())
        {
            let mut as_token = config.clone();
            as_token.postgres.url = t.postgres_url.clone();
            as_token.postgres.password = None;
            neon.insert(
                t.postgres_url.as_str().to_string(),
                AsyncPg::new(
                    pg_async_config(&as_token)?,
                    tls.clone(),
                    (t.sessions_per_worker, workers),
                    own_sessions.opened(),
                ),
            );
        }
        let pg_pooled = p.pool_size - pg_async.max() as u32;
        let pg = r2d2::Pool::builder()
            .max_size(pg_pooled)
            .min_idle(Some(p.min_idle.min(pg_pooled)))
            .connection_timeout(Duration::from_millis(p.checkout_timeout_ms))
            .test_on_check_out(false)
            .error_handler(Box::new(LogErrors("postgres")))
            .build_unchecked(PgManager::new(
                pg_config(config)?,
                tls,
                own_sessions.opened(),
            ));
        let owner = if p.owner_url.is_empty() {
            None
        } else {
            Some(
                r2d2::Pool::builder()
                    .max_size(2)
                    .min_idle(Some(0))
                    .connection_timeout(Duration::from_millis(p.checkout_timeout_ms))
                    .test_on_check_out(false)
                    .error_handler(Box::new(LogErrors("postgres (owner_url)")))
                    .build_unchecked(PgManager::new(
                        pg_config(&config.owner_config())?,
                        pg_tls(p).map_err(ApiError::internal)?,
                        Arc::default(),
                    )),
            )
        };
        Ok(Pools {
            redis,
            redis_async,
            pg: Some(pg),
            owner,
            pg_async,
            neon,
            own_sessions,
            pg_connect_timeout: Duration::from_millis(p.connect_timeout_ms),
            pg_checkout_timeout: Duration::from_millis(p.checkout_timeout_ms),
            param_types: ParamTypes::default(),
            redis_size: r.pool_size,
            redis_cluster: r.cluster,
            wakeups: wakeups == 1,
            pg_size: p.pool_size,
            pg_pooled,
            redis_down_until_ms: AtomicU64::new(0),
            redis_generation,
            redis_retry_after_failure: Duration::from_millis(r.retry_after_failure_ms),
            epoch: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether to use Redis now. After a failure the breaker is open: reads skip Redis for
    /// `retry_after_failure_ms`; then it is half-open: one caller per window probes Redis
    /// (this returns true for it alone) while the others keep skipping, until a connection
    /// succeeds and closes the breaker.
    pub fn redis_available(&self) -> bool {
        let until = self.redis_down_until_ms.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        let now = self.now_ms();
        if now < until {
            return false;
        }
        let next = now + self.redis_retry_after_failure.as_millis() as u64;
        self.redis_down_until_ms
            .compare_exchange(until, next.max(1), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Opens the circuit breaker and retires every pooled connection opened before now: a
    /// Redis that failed one connection has usually lost them all (a restart, a cut).
    pub fn mark_redis_failed(&self) {
        let until = self.now_ms() + self.redis_retry_after_failure.as_millis() as u64;
        self.redis_down_until_ms
            .store(until.max(1), Ordering::Release);
        self.redis_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// After a failure on a Redis connection. One Redis ended (`redis::connection_lost`) is
    /// replaced, with every connection opened before it (an operator's `CLIENT KILL` or an
    /// idle timeout ends them all), and the breaker stays closed: Redis may well be up, and
    /// should it be down, the next connect fails and opens the breaker. Anything else (a
    /// timeout, a refusal) opens it now.
    pub fn redis_failed(&self, e: &redis::RedisError) {
        if crate::store::redis::connection_lost(e) {
            tracing::debug!(error = %e, "redis connection lost; replacing the connections");
            self.redis_generation.fetch_add(1, Ordering::AcqRel);
            self.drop_redis_async();
        } else {
            self.mark_redis_failed();
        }
    }

    /// This worker's multiplexed Redis connection, or None: the breaker is open (the caller
    /// then takes the pooled path, which probes), or every multiplexed slot is taken.
    pub async fn redis_async(&self) -> Result<Option<AsyncConn>, ApiError> {
        if !self.redis_breaker_closed() {
            return Ok(None);
        }
        let generation = self.redis_generation.load(Ordering::Acquire);
        self.redis_async.conn(generation).await.map_err(|e| {
            self.mark_redis_failed();
            ApiError::CacheUnavailable {
                internal: e.to_string(),
            }
        })
    }

    /// Whether Redis is a cluster (`redis.cluster`).
    pub fn redis_cluster(&self) -> bool {
        self.redis_cluster
    }

    /// Forgets this worker's multiplexed connection after a failure on it.
    pub fn drop_redis_async(&self) {
        self.redis_async.drop_conn();
    }

    /// Whether a connection is set aside for fill wake-ups (`redis.pool_size` ≥ 3).
    pub fn has_wakeup_connection(&self) -> bool {
        self.wakeups
    }

    /// True while Redis is considered up (no failure since the last success). While the
    /// breaker is open or half-open, only the pooled path talks to Redis, so that its probe
    /// is the one that closes the breaker.
    pub fn redis_breaker_closed(&self) -> bool {
        self.redis_down_until_ms.load(Ordering::Acquire) == 0
    }

    fn mark_redis_up(&self) {
        if self.redis_down_until_ms.load(Ordering::Acquire) != 0 {
            self.redis_down_until_ms.store(0, Ordering::Release);
        }
    }

    /// A Redis connection, or why not. Trips the breaker on failure.
    pub fn redis_conn(&self) -> Result<RedisConn, ApiError> {
        let m = crate::metrics::global();
        m.redis_waiting.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let got = self.fresh_redis_conn();
        m.redis_waiting.fetch_sub(1, Ordering::Relaxed);
        m.checkout("redis", start.elapsed());
        match got {
            Ok(conn) => {
                self.mark_redis_up();
                Ok(conn)
            }
            Err(e) => {
                self.mark_redis_failed();
                Err(ApiError::CacheUnavailable {
                    internal: e.to_string(),
                })
            }
        }
    }

    /// A pooled connection opened since the latest failure: stale ones are dropped on the
    /// way (r2d2 closes them, as `has_broken` says), without a round trip each.
    fn fresh_redis_conn(&self) -> Result<RedisConn, r2d2::Error> {
        // Bounded: at most the pool's size of stale connections can be waiting.
        for _ in 0..self.redis_size {
            let conn = self.redis.get()?;
            if !conn.is_stale(self.redis_generation.load(Ordering::Acquire)) {
                return Ok(conn);
            }
        }
        self.redis.get()
    }

    /// A Postgres session on this worker's event loop, or None: this thread has no share, or
    /// its share is in use while the r2d2 pool has a connection to spare (the caller then
    /// uses `pg_conn`, so every connection of `postgres.pool_size` serves reads). With both
    /// in use it waits for one of its share, up to the checkout timeout.
    /// `keep_prepared`: for a `skip_reset` run only, which may find its statement prepared.
    pub async fn pg_session(&self, keep_prepared: bool) -> Result<Option<AsyncSession>, ApiError> {
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
    pub async fn pg_session_here(&self, role: Option<&str>) -> Result<AsyncSession, ApiError> {
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
    pub fn pg_conn(&self) -> Result<PgConn, ApiError> {
        self.pg_conn_keeping(false)
    }

    /// [`Pools::pg_conn`]; `keep_prepared` for a `skip_reset` read only (see `pg_session`).
    pub fn pg_conn_keeping(&self, keep_prepared: bool) -> Result<PgConn, ApiError> {
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
    pub fn has_neon_role(&self, url: &str) -> bool {
        self.neon.contains_key(url)
    }

    /// Whether Ferry's own role has sessions of its own (`postgres.owner_url`).
    pub fn has_owner_pool(&self) -> bool {
        self.owner.is_some()
    }

    /// A session of Ferry's own role, for its bookkeeping (`postgres.url`'s pool with
    /// `postgres.single_role`). Not before the sessions were found to be Ferry's own.
    pub fn owner_conn(&self) -> Result<PgConn, ApiError> {
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

    /// (open, idle) Postgres connections: the r2d2 pool's and the workers' sessions.
    pub fn pg_state(&self) -> (u32, u32) {
        let (pooled_open, pooled_idle) = self
            .pg
            .as_ref()
            .map(|p| {
                let s = p.state();
                (s.connections, s.idle_connections)
            })
            .unwrap_or((0, 0));
        let (open, idle) = self.pg_async.state();
        (pooled_open + open as u32, pooled_idle + idle as u32)
    }

    /// How many sessions the r2d2 pool holds at most: how many dead ones a restart of
    /// Postgres can leave in it.
    pub fn pg_pooled_size(&self) -> u32 {
        self.pg_pooled
    }

    /// How many event-loop sessions each worker holds at most (the same, for its share).
    pub fn pg_share(&self) -> usize {
        self.pg_async.per_worker()
    }

    pub fn sizes(&self) -> (u32, u32) {
        (self.redis_size, self.pg_size)
    }
}

/// The blocking Postgres client closes its connection by blocking on a runtime of its own,
/// which panics inside another runtime, and the last reference to the pools is often dropped
/// on an actix thread at shutdown. So the Postgres pool is dropped on a plain thread.
impl Drop for Pools {
    fn drop(&mut self) {
        if let Some(pg) = self.pg.take() {
            let owner = self.owner.take();
            let closer = std::thread::Builder::new()
                .name("ferry-pg-close".into())
                .spawn(move || drop((pg, owner)));
            if let Ok(handle) = closer {
                let _ = handle.join();
            }
        }
    }
}

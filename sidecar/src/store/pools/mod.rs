//! The two bounded r2d2 pools and the Redis circuit breaker.
//!
//! Pools never open more than `pool_size` connections, whatever the load: a request that cannot
//! get one within the checkout timeout is answered 503. Redis failures also trip a short
//! circuit breaker, so that while Redis is down reads go straight to Postgres instead of each
//! paying a connect timeout. `session`: how a request holds a Postgres session from them
//! (checked out, used, reset before anyone else gets it); `send`: the one way a request's
//! commands reach Redis (on which connection; a connection Redis ended while it stays up).
//! The connections themselves are `postgres` and `redis`. Here: the pools' sizes and how they are built; `redis_conns`: a Redis connection, and the
//! breaker; `pg_conns`: a Postgres session, pooled or on the worker's event loop.

mod pg_conns;
mod redis_conns;
pub(crate) mod send;
pub(crate) mod session;

pub(crate) use pg_conns::PgConn;

use crate::config::Config;
use crate::error::ApiError;
use crate::store::postgres::loop_session::AsyncPg;
use crate::store::postgres::own_sessions::OwnSessions;
use crate::store::postgres::param_types::ParamTypes;
use crate::store::postgres::{pg_async_config, pg_config, pg_tls, PgManager};
use crate::store::redis::{store_client, AsyncRedis, RedisManager};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) type RedisPool = r2d2::Pool<RedisManager>;
pub(crate) type PgPool = r2d2::Pool<PgManager>;
pub(crate) type RedisConn = r2d2::PooledConnection<RedisManager>;
/// Logs connection failures r2d2 meets while filling a pool (it would otherwise drop them).
#[derive(Debug)]
pub(crate) struct LogErrors(pub &'static str);

impl<E: std::fmt::Display> r2d2::HandleError<E> for LogErrors {
    fn handle_error(&self, error: E) {
        tracing::warn!(pool = self.0, %error, "cannot open connection");
    }
}

pub(crate) struct Pools {
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
    /// What Postgres said about each `/sql` read's columns (`store::postgres::described`).
    pub(crate) described: crate::store::postgres::described::Descriptions,
    /// Which named reads are plain (no reset after a successful run), as Postgres said.
    pub(crate) plain: crate::store::postgres::verdicts::Analyses,
    /// What reads cached with no tables named depend on, as Postgres said (`read::inferred`).
    pub(crate) inferred: crate::store::postgres::verdicts::Inferences,
    /// The catalog's signature: a change makes both kinds of verdicts be asked again.
    pub(crate) schema: crate::store::postgres::schema::SchemaWatch,
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
    pub(crate) fn new(config: &Config) -> Result<Pools, ApiError> {
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
            described: Default::default(),
            plain: Default::default(),
            inferred: Default::default(),
            schema: Default::default(),
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

    /// (open, idle) Postgres connections: the r2d2 pool's and the workers' sessions.
    pub(crate) fn pg_state(&self) -> (u32, u32) {
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
    pub(crate) fn pg_pooled_size(&self) -> u32 {
        self.pg_pooled
    }

    /// How many event-loop sessions each worker holds at most (the same, for its share).
    pub(crate) fn pg_share(&self) -> usize {
        self.pg_async.per_worker()
    }

    pub(crate) fn sizes(&self) -> (u32, u32) {
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

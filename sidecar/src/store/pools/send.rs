//! The one way a request's commands reach Redis, and the one place their connection is chosen:
//! this worker's multiplexed connection when it has one and the breaker is closed (no thread
//! hop); else a pooled connection, through the blocking pool. The pooled path serves the
//! workers past half of `redis.pool_size` (which have no multiplexed connection of their own)
//! and, while the breaker is open, the one caller per window that probes Redis
//! (`Pools::redis_available`): its connection's success closes the breaker. Every other caller
//! meanwhile is told at once that Redis is down, never kept waiting for a connection.
//!
//! A connection Redis ended while it stays up (`CLIENT KILL`, an idle `timeout`) is not taken
//! for Redis down (`Pools::redis_failed` keeps the breaker closed for it): the commands go
//! once more on a fresh connection where running them twice is harmless (a replay check riding
//! in front included: it knows its own earlier attempt, `nonces::NonceCheck`).

use crate::error::ApiError;
use crate::store::blocking::Blocking;
use crate::store::pools::Pools;
use crate::store::redis::{connection_lost, AsyncConn};
use redis::{Pipeline, RedisResult, Value};
use std::sync::Arc;

/// How a pipeline may be sent.
#[derive(Clone, Copy, Default)]
pub(crate) struct How {
    /// Each command answers for itself: the pipeline was built with `ignore_errors` (see
    /// `AsyncConn::query_pipe_each`). On a cluster's pooled connection the mark is lost, and
    /// one command's error fails the whole answer.
    pub each: bool,
    /// Whether the pipeline may run twice (lookups, conditional write-backs, replay checks,
    /// commands other than `INCR`): on a connection Redis ended it goes again, once.
    pub again: bool,
}

/// Redis's answer. A failed one is the caller's to report (`Pools::redis_failed`), except a
/// lost connection, reported here.
pub(crate) type Sent = RedisResult<Vec<Value>>;

/// Sends `pipe` (see the module). Err: no connection (Redis down: the breaker is open, or
/// connecting just opened it: `CacheUnavailable`), or the blocking pool refused the work
/// (`Overloaded`, `Timeout`).
pub(crate) async fn send(
    pools: &Arc<Pools>,
    blocking: &Blocking,
    pipe: &Pipeline,
    how: How,
) -> Result<Sent, ApiError> {
    if !pools.redis_available() {
        return Err(ApiError::CacheUnavailable {
            internal: "redis is down (the breaker is open)".into(),
        });
    }
    if let Some(mut conn) = pools.redis_async().await? {
        return Ok(on_loop(pools, &mut conn, pipe, how).await);
    }
    let (p, pipe) = (pools.clone(), pipe.clone());
    blocking.run(move || pooled(&p, &pipe, how)).await
}

/// Whether `send`'s failure is Redis's (the request goes on without the cache), not the
/// blocking pool's refusal (the request is answered with it).
pub(crate) fn redis_down(e: &ApiError) -> bool {
    matches!(e, ApiError::CacheUnavailable { .. })
}

async fn on_loop(pools: &Pools, conn: &mut AsyncConn, pipe: &Pipeline, how: How) -> Sent {
    let e = match conn.query_values(pipe, how.each).await {
        Ok(values) => return Ok(values),
        Err(e) => e,
    };
    if !connection_lost(&e) {
        pools.drop_redis_async();
        return Err(e);
    }
    pools.redis_failed(&e);
    if !how.again {
        return Err(e);
    }
    let mut fresh = match pools.redis_async().await {
        Ok(Some(c)) => c,
        _ => return Err(e),
    };
    let out = fresh.query_values(pipe, how.each).await;
    if out.is_err() {
        pools.drop_redis_async();
    }
    out
}

/// On a pooled connection (blocking). Connecting trips the breaker itself when it fails.
fn pooled(pools: &Pools, pipe: &Pipeline, how: How) -> Result<Sent, ApiError> {
    let mut conn = pools.redis_conn()?;
    match conn.query_pipe(pipe) {
        Err(e) if how.again && connection_lost(&e) => {
            // Retires this connection with every other opened before it.
            pools.redis_failed(&e);
            drop(conn);
            Ok(pools.redis_conn()?.query_pipe(pipe))
        }
        values => Ok(values),
    }
}

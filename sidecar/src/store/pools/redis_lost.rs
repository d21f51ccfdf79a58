//! Connections Redis ended while it stays up (`CLIENT KILL`, an idle `timeout`): the request
//! runs once more on a fresh connection where running it twice is harmless, instead of the
//! cache being taken for down (`Pools::redis_failed` keeps the breaker closed for them).

use crate::error::ApiError;
use crate::store::pools::Pools;
use crate::store::redis::{connection_lost, AsyncConn};
use redis::{FromRedisValue, Pipeline, RedisResult, Value};

/// Runs `pipe` on a pooled connection; on one Redis ended, once more on a fresh one when the
/// pipeline may run twice (`repeatable`: lookups, write-backs, invalidations with fresh
/// tokens, commands other than `INCR`). Connecting trips the breaker itself; a failed answer
/// is left to the caller (`Pools::redis_failed`).
pub(crate) fn query<T: FromRedisValue>(
    pools: &Pools,
    pipe: &Pipeline,
    repeatable: bool,
) -> Result<RedisResult<T>, ApiError> {
    let mut conn = pools.redis_conn()?;
    match conn.query_pipe(pipe) {
        Err(e) if repeatable && connection_lost(&e) => {
            // Retires this connection with every other opened before it.
            pools.redis_failed(&e);
            drop(conn);
            Ok(pools.redis_conn()?.query_pipe(pipe))
        }
        other => Ok(other),
    }
}

/// [`query`] on this worker's multiplexed connection `conn` (`each`: every command answers
/// for itself, see [`AsyncConn::query_pipe_each`]). On a connection Redis ended, `again` (what
/// may run twice; None when nothing may) goes once on a fresh one. The answer, and whether it
/// is `again`'s. A failed answer has already dropped the worker's connection.
pub(crate) async fn query_async(
    pools: &Pools,
    conn: &mut AsyncConn,
    pipe: &Pipeline,
    each: bool,
    again: impl FnOnce() -> Option<Pipeline>,
) -> (RedisResult<Vec<Value>>, bool) {
    let first = conn.query_values(pipe, each).await;
    let again = match &first {
        Ok(_) => return (first, false),
        Err(e) if connection_lost(e) => {
            pools.redis_failed(e);
            match again() {
                Some(again) => again,
                None => return (first, false),
            }
        }
        Err(_) => {
            pools.drop_redis_async();
            return (first, false);
        }
    };
    let mut fresh = match pools.redis_async().await {
        Ok(Some(c)) => c,
        _ => return (first, false),
    };
    let out = fresh.query_values(&again, each).await;
    if out.is_err() {
        pools.drop_redis_async();
    }
    (out, true)
}

/// `pipe` without its first `n` commands (what rode in front of a request's own: a replay
/// check, which must not run twice).
pub(crate) fn without_front(pipe: &Pipeline, n: usize) -> Pipeline {
    let mut p = redis::pipe();
    if pipe.is_transaction() {
        p.atomic();
    }
    for cmd in pipe.cmd_iter().skip(n) {
        p.add_command(cmd.clone());
    }
    p
}

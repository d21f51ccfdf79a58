//! Redis connections from the pools, and the circuit breaker: while Redis is down, reads skip
//! it for `redis.retry_after_failure_ms`, then one caller per window probes it.

use super::{Pools, RedisConn};
use crate::error::ApiError;
use crate::store::redis::AsyncConn;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Pools {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether to use Redis now. After a failure the breaker is open: reads skip Redis for
    /// `retry_after_failure_ms`; then it is half-open: one caller per window probes Redis
    /// (this returns true for it alone) while the others keep skipping, until a connection
    /// succeeds and closes the breaker.
    pub(crate) fn redis_available(&self) -> bool {
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

    /// Whether Redis may be tried now: the breaker closed, or open past its window. Unlike
    /// [`Pools::redis_available`] it claims nothing: `store::pools::send` does, for the one
    /// caller that then probes.
    pub(crate) fn redis_due(&self) -> bool {
        let until = self.redis_down_until_ms.load(Ordering::Acquire);
        until == 0 || self.now_ms() >= until
    }

    /// Opens the circuit breaker and retires every pooled connection opened before now: a
    /// Redis that failed one connection has usually lost them all (a restart, a cut).
    pub(crate) fn mark_redis_failed(&self) {
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
    pub(crate) fn redis_failed(&self, e: &redis::RedisError) {
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
    pub(crate) async fn redis_async(&self) -> Result<Option<AsyncConn>, ApiError> {
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
    pub(crate) fn redis_cluster(&self) -> bool {
        self.redis_cluster
    }

    /// Forgets this worker's multiplexed connection after a failure on it.
    pub(crate) fn drop_redis_async(&self) {
        self.redis_async.drop_conn();
    }

    /// Whether a connection is set aside for fill wake-ups (`redis.pool_size` ≥ 3).
    pub(crate) fn has_wakeup_connection(&self) -> bool {
        self.wakeups
    }

    /// True while Redis is considered up (no failure since the last success). While the
    /// breaker is open or half-open, only the pooled path talks to Redis, so that its probe
    /// is the one that closes the breaker.
    pub(crate) fn redis_breaker_closed(&self) -> bool {
        self.redis_down_until_ms.load(Ordering::Acquire) == 0
    }

    fn mark_redis_up(&self) {
        if self.redis_down_until_ms.load(Ordering::Acquire) != 0 {
            self.redis_down_until_ms.store(0, Ordering::Release);
        }
    }

    /// A Redis connection, or why not. Trips the breaker on failure.
    pub(crate) fn redis_conn(&self) -> Result<RedisConn, ApiError> {
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
}

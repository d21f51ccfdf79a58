//! Per-user request rate (`identity.rate_per_s`, `identity.burst`): one GCRA bucket per end
//! user in Redis, so the limit holds across every sidecar sharing the Redis.
//!
//! GCRA keeps one number per user, the "theoretical arrival time" of their next request; a
//! request is let through when it is no further ahead of now than the burst allows, and moves
//! it on by one interval. One script call, atomic, timed by Redis's own clock (sidecars'
//! clocks never disagree about a user). The key expires once the bucket is full again.
//!
//! Redis unavailable: requests are let through (the limit is a guard against one user crowding
//! out others, not an access rule, and Redis down must never fail a read Postgres can serve).

use crate::http::error::ApiError;
use crate::store::pools::Pools;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// ARGV: interval and tolerance in microseconds. Returns 0 (let through) or the microseconds
/// to wait.
static GCRA: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
        local interval = tonumber(ARGV[1])
        local tolerance = tonumber(ARGV[2])
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
        if tat < now then tat = now end
        if now < tat - tolerance then return tat - tolerance - now end
        local next = tat + interval
        redis.call('SET', KEYS[1], string.format('%.0f', next),
                   'PX', math.floor((next - now) / 1000) + 1)
        return 0
        ",
    )
});

/// One user's limit: `per_s` requests a second on average, `burst` at once.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub per_s: u32,
    pub burst: u32,
}

impl Rate {
    fn args(&self) -> (u64, u64) {
        let interval = 1_000_000 / u64::from(self.per_s.max(1));
        (interval, interval * u64::from(self.burst.saturating_sub(1)))
    }
}

/// The bucket's key: a hash of who the user is (`SessionIdentity::user`).
fn key(prefix: &str, user: &str) -> String {
    let digest = hex::encode(Sha256::digest(user.as_bytes()));
    format!("{prefix}rl:{}", &digest[..32])
}

fn verdict(waited_us: redis::RedisResult<u64>) -> Result<(), ApiError> {
    match waited_us {
        Ok(0) => Ok(()),
        Ok(us) => Err(ApiError::RateLimited {
            retry_after_s: us.div_ceil(1_000_000).max(1),
        }),
        Err(e) => {
            tracing::debug!(error = %e, "rate limit not checked: redis failed; let through");
            Ok(())
        }
    }
}

/// On this worker's multiplexed connection; None when it has none (the caller then checks on
/// the pool, off the event loop).
pub async fn check_async(
    pools: &Pools,
    prefix: &str,
    user: &str,
    rate: Rate,
) -> Option<Result<(), ApiError>> {
    let mut conn = match pools.redis_async().await {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(_) => return Some(Ok(())),
    };
    let (interval, tolerance) = rate.args();
    let waited = GCRA
        .key(key(prefix, user))
        .arg(interval)
        .arg(tolerance)
        .invoke_async(&mut conn)
        .await;
    if waited.is_err() {
        pools.drop_redis_async();
    }
    Some(verdict(waited))
}

/// On a pooled connection (blocking).
pub fn check(pools: &Pools, prefix: &str, user: &str, rate: Rate) -> Result<(), ApiError> {
    let Ok(mut conn) = pools.redis_conn() else {
        return Ok(());
    };
    let (interval, tolerance) = rate.args();
    verdict(
        GCRA.key(key(prefix, user))
            .arg(interval)
            .arg(tolerance)
            .invoke(&mut *conn),
    )
}

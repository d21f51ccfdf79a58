//! Per-user request rate (`identity.rate_per_s`, `identity.burst`): one GCRA bucket per end
//! user in Redis, so the limit holds across every sidecar sharing the Redis.
//!
//! GCRA keeps one number per user, the "theoretical arrival time" of their next request; a
//! request is let through when it is no further ahead of now than the burst allows, and moves
//! it on by one interval. One script call, atomic, timed by Redis's own clock (sidecars'
//! clocks never disagree about a user). The key expires once the bucket is full again.
//!
//! Redis unavailable: each sidecar keeps the same bucket in its own memory meanwhile ([`local`]),
//! so a user is held to the rate per sidecar rather than let through without a bound (which a
//! user could provoke by filling Redis, or time with an outage). Not an access rule either way:
//! a request under the rate is never refused for Redis's sake.

use crate::error::ApiError;
use crate::store::blocking::Blocking;
use crate::store::pools::send::{redis_down, send, How};
use crate::store::pools::Pools;
use redis::Value;
use sha2::{Digest, Sha256};
use std::sync::{Arc, LazyLock};

/// ARGV: interval and tolerance in microseconds. Returns 0 (let through) or the microseconds
/// to wait.
const GCRA: &str = r"
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
        ";

/// One user's limit: `per_s` requests a second on average, `burst` at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
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

fn verdict(waited_us: redis::RedisResult<u64>, user: &str, rate: Rate) -> Result<(), ApiError> {
    match waited_us {
        Ok(0) => Ok(()),
        Ok(us) => Err(limited(us)),
        Err(e) => {
            tracing::debug!(error = %e, "rate limit: redis failed; this sidecar's own bucket");
            local(user, rate)
        }
    }
}

fn limited(waited_us: u64) -> ApiError {
    ApiError::RateLimited {
        retry_after_s: waited_us.div_ceil(1_000_000).max(1),
    }
}

/// The buckets this sidecar keeps while Redis is unavailable: user -> theoretical arrival time
/// (microseconds on this process's clock).
static LOCAL: LazyLock<std::sync::Mutex<std::collections::HashMap<String, u64>>> =
    LazyLock::new(Default::default);
/// Past this many users, buckets that are full again are forgotten (their next request starts
/// a fresh one, exactly as a full bucket would answer).
const LOCAL_USERS: usize = 10_000;

/// GCRA in this sidecar's memory, as the Redis script does it.
pub(crate) fn local(user: &str, rate: Rate) -> Result<(), ApiError> {
    static EPOCH: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);
    let now = EPOCH.elapsed().as_micros() as u64;
    let (interval, tolerance) = rate.args();
    let mut buckets = LOCAL.lock().unwrap_or_else(|p| p.into_inner());
    if buckets.len() >= LOCAL_USERS {
        buckets.retain(|_, tat| *tat > now);
    }
    let tat = buckets.get(user).copied().unwrap_or(0).max(now);
    if now + tolerance < tat {
        return Err(limited(tat - tolerance - now));
    }
    buckets.insert(user.to_string(), tat + interval);
    Ok(())
}

/// One request against `user`'s bucket (one script call: `send`, on this worker's multiplexed
/// connection when it can). Redis unavailable: this sidecar's own bucket ([`local`]). Err
/// also when the blocking pool refused the work.
pub(crate) async fn check(
    (pools, blocking): (&Arc<Pools>, &Blocking),
    prefix: &str,
    user: &str,
    rate: Rate,
) -> Result<(), ApiError> {
    let (interval, tolerance) = rate.args();
    // EVAL with the script's text: Redis keeps it compiled by its hash, and a Redis that lost
    // it (a restart, SCRIPT FLUSH) needs no second round trip.
    let mut pipe = redis::pipe();
    pipe.cmd("EVAL")
        .arg(GCRA)
        .arg(1)
        .arg(key(prefix, user))
        .arg(interval)
        .arg(tolerance);
    // The script moves the bucket: it never runs twice.
    let waited = match send(pools, blocking, &pipe, How::default()).await {
        Ok(sent) => sent,
        Err(e) if redis_down(&e) => return local(user, rate),
        Err(e) => return Err(e),
    };
    let waited = waited.and_then(|v| redis::from_redis_value(Value::Array(v)).map_err(Into::into));
    verdict(waited.map(|(us,): (u64,)| us), user, rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_bucket_admits_the_burst_then_the_rate() {
        let rate = Rate { per_s: 1, burst: 3 };
        let user = "local-bucket-test";
        let admitted = (0..10).filter(|_| local(user, rate).is_ok()).count();
        assert_eq!(admitted, 3);
        assert!(local("another-user", rate).is_ok());
    }
}

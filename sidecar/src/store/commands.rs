//! Plain cache commands (`POST /v1/cache`) on caller-managed keys, in their own namespace.
//! These are the cache itself, so unlike reads they fail (503) when Redis is down.

use crate::config::Limits;
use crate::http::error::ApiError;
use crate::store::cache::Cache;
use crate::store::pools::Pools;
use ferry_shared::api::{CacheCommand, CacheReply};

/// Checks keys and TTLs before any Redis work, naming the field at fault.
pub fn validate(limits: &Limits, cmd: &CacheCommand) -> Result<(), ApiError> {
    let ttl_ok = |ttl: Option<u64>| ttl.map_or(Ok(()), |t| limits.ttl("ttl_s", t));
    let max = limits.max_batch;
    match cmd {
        CacheCommand::Get { key } | CacheCommand::Incr { key, .. } => limits.key("key", key),
        CacheCommand::Set { key, ttl_s, .. } => limits.key("key", key).and(ttl_ok(*ttl_s)),
        CacheCommand::Expire { key, ttl_s } => limits.key("key", key).and(ttl_ok(Some(*ttl_s))),
        CacheCommand::Del { keys } | CacheCommand::Mget { keys } => limits.keys("keys", keys, max),
        CacheCommand::Mset { entries, ttl_s } => {
            limits.batch("entries", entries.len(), "entries")?;
            entries
                .iter()
                .enumerate()
                .try_for_each(|(i, e)| limits.key(&format!("entries[{i}].key"), &e.key))
                .and(ttl_ok(*ttl_s))
        }
    }
}

/// Runs one command (blocking).
pub fn run(pools: &Pools, cache: &Cache, cmd: CacheCommand) -> Result<CacheReply, ApiError> {
    let mut conn = pools.redis_conn()?;
    let k = |key: &str| cache.plain_key(key);
    let result: redis::RedisResult<Result<CacheReply, ApiError>> = match cmd {
        CacheCommand::Get { key } => redis::cmd("GET")
            .arg(k(&key))
            .query::<Option<Vec<u8>>>(&mut *conn)
            .map(|v| text(&key, v).map(|value| CacheReply::Get { value })),
        CacheCommand::Set { key, value, ttl_s } => {
            let mut c = redis::cmd("SET");
            c.arg(k(&key)).arg(value);
            if let Some(t) = ttl_s {
                c.arg("EX").arg(t);
            }
            c.query::<()>(&mut *conn).map(|_| Ok(CacheReply::Set {}))
        }
        CacheCommand::Del { keys } => {
            let names: Vec<String> = keys.iter().map(|x| k(x)).collect();
            redis::cmd("DEL")
                .arg(names)
                .query::<u64>(&mut *conn)
                .map(|deleted| Ok(CacheReply::Del { deleted }))
        }
        CacheCommand::Mget { keys } => {
            let names: Vec<String> = keys.iter().map(|x| k(x)).collect();
            redis::cmd("MGET")
                .arg(names)
                .query::<Vec<Option<Vec<u8>>>>(&mut *conn)
                .map(|vals| {
                    keys.iter()
                        .zip(vals)
                        .map(|(key, v)| text(key, v))
                        .collect::<Result<Vec<_>, _>>()
                        .map(|values| CacheReply::Mget { values })
                })
        }
        CacheCommand::Mset { entries, ttl_s } => {
            // One MULTI: every entry is written, with its TTL, or none is.
            let mut pipe = redis::pipe();
            pipe.atomic();
            for e in &entries {
                let c = pipe.cmd("SET").arg(k(&e.key)).arg(&e.value);
                if let Some(t) = ttl_s {
                    c.arg("EX").arg(t);
                }
                c.ignore();
            }
            pipe.query::<()>(&mut *conn)
                .map(|_| Ok(CacheReply::Mset {}))
        }
        CacheCommand::Incr { key, by } => redis::cmd("INCRBY")
            .arg(k(&key))
            .arg(by)
            .query::<i64>(&mut *conn)
            .map(|value| Ok(CacheReply::Incr { value })),
        CacheCommand::Expire { key, ttl_s } => redis::cmd("EXPIRE")
            .arg(k(&key))
            .arg(ttl_s)
            .query::<i64>(&mut *conn)
            .map(|n| Ok(CacheReply::Expire { applied: n == 1 })),
    };
    result.unwrap_or_else(|e| {
        if matches!(e.code(), Some("ERR" | "WRONGTYPE")) {
            // e.g. INCR on a value that is not an integer: the caller's mistake.
            return Err(ApiError::invalid(
                "key",
                "the stored value does not support this command",
            ));
        }
        pools.mark_redis_failed();
        Err(ApiError::CacheUnavailable {
            internal: e.to_string(),
        })
    })
}

fn text(key: &str, v: Option<Vec<u8>>) -> Result<Option<String>, ApiError> {
    v.map(|bytes| String::from_utf8(bytes).map_err(|_| ApiError::NotText { key: key.into() }))
        .transpose()
}

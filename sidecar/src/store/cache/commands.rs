//! Plain cache commands (`POST /v1/cache`) on caller-managed keys, in their own namespace.
//! These are the cache itself, so unlike reads they fail (503) when Redis is down.

use crate::config::Limits;
use crate::error::ApiError;
use crate::store::blocking::Blocking;
use crate::store::cache::Cache;
use crate::store::coordination::nonces::NonceCheck;
use crate::store::pools::send::{send, How};
use crate::store::pools::Pools;
use ferry_shared::api::{CacheCommand, CacheReply};
use redis::Value;
use std::sync::Arc;

/// Checks keys and TTLs before any Redis work, naming the field at fault.
pub(crate) fn validate(limits: &Limits, cmd: &CacheCommand) -> Result<(), ApiError> {
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
                .try_for_each(|(i, e)| limits.key(format_args!("entries[{i}].key"), &e.key))
                .and(ttl_ok(*ttl_s))
        }
    }
}

/// One command as Redis will run it, and how to read its answer.
struct Prepared {
    pipe: redis::Pipeline,
    answer: Answer,
}

enum Answer {
    Get(String),
    Set,
    Del,
    Mget(Vec<String>),
    Mset,
    Incr,
    Expire,
}

impl Answer {
    /// Whether the command may run twice (on a connection Redis ended, it may have run once):
    /// all but INCR, whose second run would count twice.
    fn repeatable(&self) -> bool {
        !matches!(self, Answer::Incr)
    }
}

/// The command's pipeline, behind `check`'s commands when one rides along.
fn prepare(cache: &Cache, cmd: CacheCommand, check: Option<&NonceCheck>) -> Prepared {
    let k = |key: &str| cache.plain_key(key);
    let mut pipe = redis::pipe();
    if let Some(c) = check {
        c.add_to(&mut pipe);
    }
    let answer = match cmd {
        CacheCommand::Get { key } => {
            pipe.cmd("GET").arg(k(&key));
            Answer::Get(key)
        }
        CacheCommand::Set { key, value, ttl_s } => {
            let c = pipe.cmd("SET").arg(k(&key)).arg(value);
            if let Some(t) = ttl_s {
                c.arg("EX").arg(t);
            }
            Answer::Set
        }
        CacheCommand::Del { keys } => {
            pipe.cmd("DEL")
                .arg(keys.iter().map(|x| k(x)).collect::<Vec<_>>());
            Answer::Del
        }
        CacheCommand::Mget { keys } => {
            pipe.cmd("MGET")
                .arg(keys.iter().map(|x| k(x)).collect::<Vec<_>>());
            Answer::Mget(keys)
        }
        CacheCommand::Mset { entries, ttl_s } => {
            // One MULTI: every entry is written, with its TTL, or none is.
            pipe.atomic();
            for e in &entries {
                let c = pipe.cmd("SET").arg(k(&e.key)).arg(&e.value);
                if let Some(t) = ttl_s {
                    c.arg("EX").arg(t);
                }
            }
            Answer::Mset
        }
        CacheCommand::Incr { key, by } => {
            pipe.cmd("INCRBY").arg(k(&key)).arg(by);
            Answer::Incr
        }
        CacheCommand::Expire { key, ttl_s } => {
            pipe.cmd("EXPIRE").arg(k(&key)).arg(ttl_s);
            Answer::Expire
        }
    };
    Prepared { pipe, answer }
}

fn read(answer: Answer, values: Vec<Value>) -> redis::RedisResult<Result<CacheReply, ApiError>> {
    let first = values.into_iter().next().unwrap_or(Value::Nil);
    Ok(match answer {
        Answer::Get(key) => {
            let v: Option<Vec<u8>> = redis::from_redis_value(first)?;
            text(&key, v).map(|value| CacheReply::Get { value })
        }
        Answer::Set => Ok(CacheReply::Set {}),
        Answer::Del => Ok(CacheReply::Del {
            deleted: redis::from_redis_value(first)?,
        }),
        Answer::Mget(keys) => {
            let vals: Vec<Option<Vec<u8>>> = redis::from_redis_value(first)?;
            keys.iter()
                .zip(vals)
                .map(|(key, v)| text(key, v))
                .collect::<Result<Vec<_>, _>>()
                .map(|values| CacheReply::Mget { values })
        }
        Answer::Mset => Ok(CacheReply::Mset {}),
        Answer::Incr => Ok(CacheReply::Incr {
            value: redis::from_redis_value(first)?,
        }),
        Answer::Expire => {
            let n: i64 = redis::from_redis_value(first)?;
            Ok(CacheReply::Expire { applied: n == 1 })
        }
    })
}

/// A Redis failure: the caller's mistake (a command the stored value does not support) is a
/// 400; anything else is Redis trouble, which trips the breaker. A command that may not run
/// twice (`once`: INCR) whose connection failed after it could have been sent, or whose reply
/// never came in time, may have run: 503 `outcome_unknown`, never `cache_unavailable`, which
/// reads as "nothing ran" and invites sending it again.
fn failed(pools: &Pools, e: redis::RedisError, once: bool) -> Result<CacheReply, ApiError> {
    if matches!(e.code(), Some("ERR" | "WRONGTYPE")) {
        // e.g. INCR on a value that is not an integer.
        return Err(ApiError::invalid(
            "key",
            "the stored value does not support this command",
        ));
    }
    pools.redis_failed(&e);
    // Timeouts and dropped connections are I/O errors too; a refused connection sent nothing.
    let maybe_sent = e.is_io_error() && !e.is_connection_refusal();
    if once && maybe_sent {
        return Err(ApiError::CacheOutcomeUnknown {
            internal: e.to_string(),
        });
    }
    Err(ApiError::CacheUnavailable {
        internal: e.to_string(),
    })
}

/// Runs one command on the event loop, over this worker's multiplexed connection (no thread
/// hop; concurrent commands share the connection, pipelined); on the blocking pool when this
/// worker has none (see `redis::AsyncRedis`).
pub(crate) async fn run(
    pools: &Arc<Pools>,
    cache: &Arc<Cache>,
    blocking: &Blocking,
    cmd: CacheCommand,
) -> Result<CacheReply, ApiError> {
    run_checked(pools, cache, blocking, cmd, None).await.1
}

/// [`run`] with the request's shared replay check in front of the command (for reads: the
/// check must settle before anything takes effect). The check's verdict comes first; None
/// when it was not sent or its pipeline failed, and `store::coordination::nonces::settle` then runs it on
/// its own.
pub(crate) async fn run_checked(
    pools: &Arc<Pools>,
    cache: &Arc<Cache>,
    blocking: &Blocking,
    cmd: CacheCommand,
    check: Option<&NonceCheck>,
) -> (Option<Result<(), ApiError>>, Result<CacheReply, ApiError>) {
    if pools.redis_cluster() {
        if let Err(e) = one_slot(cache, &cmd) {
            return (None, Err(e));
        }
    }
    // On a cluster a lone MGET over many slots is split by the cluster client; in a pipeline
    // it would go whole to its first key's slot. So there the check goes alone.
    let check = check.filter(|_| !pools.redis_cluster());
    let Prepared { pipe, answer } = prepare(cache, cmd, check);
    // On a connection Redis ended, the command goes again if it may run twice (the replay
    // check riding in front may: it knows its own earlier attempt).
    let how = How {
        each: check.is_some(),
        again: answer.repeatable(),
    };
    let sent = match send(pools, blocking, &pipe, how).await {
        Ok(sent) => sent,
        Err(e) => return (None, Err(e)),
    };
    let (verdict, values) = NonceCheck::split(check, sent);
    let once = !answer.repeatable();
    let reply = values
        .and_then(|v| read(answer, v))
        .unwrap_or_else(|e| failed(pools, e, once));
    (verdict, reply)
}

/// On a Redis Cluster an mset is one MULTI, which runs on one node: its keys must share a hash
/// slot, as Redis itself requires (a common `{hash tag}` in the keys keeps them together).
fn one_slot(cache: &Cache, cmd: &CacheCommand) -> Result<(), ApiError> {
    let CacheCommand::Mset { entries, .. } = cmd else {
        return Ok(());
    };
    let slot = |key: &str| crate::store::redis::slot(cache.plain_key(key).as_bytes());
    match entries.first() {
        Some(first) if entries.iter().any(|e| slot(&e.key) != slot(&first.key)) => {
            Err(ApiError::invalid(
                "entries",
                "on a Redis Cluster an mset's keys must share a hash slot: give them a common {tag}",
            ))
        }
        _ => Ok(()),
    }
}

fn text(key: &str, v: Option<Vec<u8>>) -> Result<Option<String>, ApiError> {
    v.map(|bytes| String::from_utf8(bytes).map_err(|_| ApiError::NotText { key: key.into() }))
        .transpose()
}

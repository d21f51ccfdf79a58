//! The Upstash-compatible endpoints on a Redis Cluster. Commands run where their first key's
//! slot lives: a pipeline is split into one pipeline per slot, all sent at once on the worker's
//! multiplexed cluster connection, answers put back in order, each command's error kept as its
//! own answer; a MULTI/EXEC must stay in one slot, as on any Redis Cluster (CROSSSLOT
//! otherwise). Scripts are refused: their per-user connections are one server's.

use super::{Prepared, Refused};
use crate::store::pools::Pools;
use crate::store::redis::{send_by_slot, AsyncConn, SlotPipes};
use redis::Value;

/// Refuses what a cluster cannot run: scripts; for a MULTI/EXEC, keys in different slots
/// (Redis's own words). Err: the whole request's refusal.
pub(crate) fn admit(
    prepared: &mut [Result<Prepared, Refused>],
    atomic: bool,
) -> Result<(), String> {
    for p in prepared.iter_mut() {
        if p.as_ref().is_ok_and(|p| p.script) {
            *p = Err(Refused(
                "ERR Command is not allowed: scripts are not available when Ferry runs on a \
                 Redis Cluster"
                    .into(),
            ));
        }
    }
    let mut slots = prepared.iter().flatten().filter(|p| p.first_key.is_some());
    let first = slots.next().map(Prepared::slot);
    if atomic && slots.any(|p| Some(p.slot()) != first) {
        return Err("CROSSSLOT Keys in request don't hash to the same slot".into());
    }
    Ok(())
}

/// Runs the admitted commands (in order, refused ones skipped) on this worker's multiplexed
/// cluster connection: Ok(None) when it has none (the breaker is open, or every slot is taken).
pub(crate) async fn run(
    pools: &Pools,
    prepared: &[Result<Prepared, Refused>],
    atomic: bool,
) -> Result<Option<Vec<Value>>, redis::RedisError> {
    let Ok(Some(AsyncConn::Cluster(conn))) = pools.redis_async().await else {
        return Ok(None);
    };
    let by_slot = prepared.iter().flatten().map(|p| {
        let mut cmd = redis::Cmd::new();
        for a in &p.args {
            cmd.arg(a.as_slice());
        }
        // A MULTI/EXEC is one pipeline: `admit` made sure its keys share a slot.
        (if atomic { 0 } else { p.slot() }, cmd)
    });
    let how = SlotPipes {
        keep_errors: true,
        atomic,
    };
    let values = send_by_slot(&conn, by_slot, how).await?;
    Ok(Some(values))
}

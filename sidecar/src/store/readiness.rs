//! Readiness, probed in the background. `/readyz` (and the edge's `/health` behind it) answers
//! from a snapshot at most `server.readiness_interval_ms` old, so traffic on it, however heavy
//! and from wherever, never reaches the pools: one probe per interval whatever the load.

use crate::store::pools::{PgConn, Pools};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub redis: bool,
    pub postgres: bool,
}

#[derive(Default)]
pub struct Readiness {
    /// None until the first probe has finished (reported as not ready).
    last: RwLock<Option<Snapshot>>,
    probes: AtomicU64,
}

impl Readiness {
    /// The latest probe's result.
    pub fn snapshot(&self) -> Option<Snapshot> {
        *self.last.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Probes made so far (each checks out one Redis and one Postgres connection).
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    fn probe(&self, pools: &Pools) {
        let redis = pools
            .redis_conn()
            .ok()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut *c).ok())
            .is_some();
        // Until the sessions are found to be Ferry's own (Postgres was down at startup), each
        // probe asks; a refusal is for good, and is said in the log when found.
        // Once found Ferry's own, the sessions are probed again after the pools opened new
        // connections, on two of the pool's own (a checkout that fails waits for the next tick).
        if let Some(opened) = pools.own_sessions.recheck_due() {
            if let Some((mut a, mut b)) = pooled_pair(pools) {
                let out = pools
                    .own_sessions
                    .recheck_on(&mut a.client, &mut b.client, opened);
                // Whatever a failed probe left on them (a transaction, its mark) goes with them.
                a.poisoned |= out.is_err();
                b.poisoned |= out.is_err();
            }
        }
        let postgres = pools.own_sessions.check().is_ok() && crate::store::db::ping(pools).is_ok();
        self.probes.fetch_add(1, Ordering::Relaxed);
        *self.last.write().unwrap_or_else(|p| p.into_inner()) = Some(Snapshot { redis, postgres });
    }
}

/// Two of the pool's sessions for the probe again, if each comes within 50 ms: never one held
/// while waiting long for the other, which requests may be waiting for too. A pool of one has
/// no pair to give (it is not probed again).
fn pooled_pair(pools: &Pools) -> Option<(PgConn, PgConn)> {
    let pool = pools.pg.as_ref().filter(|_| pools.pg_pooled_size() >= 2)?;
    let wait = Duration::from_millis(50);
    Some((pool.get_timeout(wait).ok()?, pool.get_timeout(wait).ok()?))
}

/// How soon the sessions are asked again while Postgres could not be asked at all.
const UNCHECKED_RETRY: Duration = Duration::from_millis(200);

/// Probes at once, then every `every`, until the state is dropped.
pub fn spawn_probe(readiness: Weak<Readiness>, pools: Weak<Pools>, every: Duration) {
    let spawned = std::thread::Builder::new()
        .name("ferry-readiness".into())
        .spawn(move || loop {
            let (Some(r), Some(p)): (Option<Arc<Readiness>>, Option<Arc<Pools>>) =
                (readiness.upgrade(), pools.upgrade())
            else {
                return;
            };
            r.probe(&p);
            // Nothing is served from Postgres until its sessions are checked: while they could
            // not be, asked again soon, not after a whole interval (which may be long).
            let next = if p.own_sessions.unchecked() {
                every.min(UNCHECKED_RETRY)
            } else {
                every
            };
            drop((r, p));
            std::thread::sleep(next);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the readiness probe thread");
    }
}

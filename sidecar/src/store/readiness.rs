//! Readiness, probed in the background. `/readyz` (and the edge's `/health` behind it) answers
//! from a snapshot at most `server.readiness_interval_ms` old, so traffic on it, however heavy
//! and from wherever, never reaches the pools: one probe per interval whatever the load.

use crate::store::pools::{PgConn, Pools};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub redis: bool,
    pub postgres: bool,
}

#[derive(Default)]
pub(crate) struct Readiness {
    /// None until the first probe has finished (reported as not ready).
    last: RwLock<Option<Snapshot>>,
    probes: AtomicU64,
    /// The login role's and the database's own settings, as last seen (`db::role_settings`).
    role_settings: RwLock<Vec<String>>,
    /// When they were last read: every `SETTINGS_EVERY`, not every probe.
    settings_read: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often the role's settings are read (a catalog query: not on every readiness probe).
const SETTINGS_EVERY: Duration = Duration::from_secs(5);

impl Readiness {
    /// The latest probe's result.
    pub(crate) fn snapshot(&self) -> Option<Snapshot> {
        *self.last.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Settings the login role or the database carry (`name=value`), as last probed.
    /// Probes made so far (each checks out one Redis and one Postgres connection).
    pub(crate) fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    pub(crate) fn role_settings(&self) -> Vec<String> {
        self.role_settings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn settings_due(&self) -> bool {
        let mut last = self.settings_read.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < SETTINGS_EVERY) {
            return false;
        }
        *last = Some(std::time::Instant::now());
        true
    }

    /// Keeps what the probe saw; said in the log whenever it changes, since a request's SQL
    /// can set its own role's defaults (`ALTER ROLE ... SET` inside a DO block, which no text
    /// check sees). Those Ferry depends on are pinned at connect and have no effect; the log
    /// names every one, so an operator sees the attempt and can `ALTER ROLE ... RESET`.
    fn saw_role_settings(&self, now: Vec<String>) {
        let mut seen = self
            .role_settings
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if *seen != now {
            if !now.is_empty() {
                tracing::warn!(
                    settings = ?now,
                    "postgres: the login role or the database carries settings of its own \
                     (ALTER ROLE/DATABASE ... SET); Ferry's sessions pin the ones it depends on"
                );
            }
            *seen = now;
        }
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
        let postgres = pools.own_sessions.check().is_ok()
            && crate::store::statements::pooled::ping(pools).is_ok();
        if postgres && self.settings_due() {
            if let Ok(settings) = crate::store::statements::pooled::role_settings(pools) {
                self.saw_role_settings(settings);
            }
        }
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
    let get = || PgConn::checked_out(pool.get_timeout(wait).ok()?).ok();
    Some((get()?, get()?))
}

/// How soon the sessions are asked again while Postgres could not be asked at all.
const UNCHECKED_RETRY: Duration = Duration::from_millis(200);

/// Probes at once, then every `every`, until the state is dropped.
pub(crate) fn spawn_probe(
    background: &crate::background::Background,
    readiness: Weak<Readiness>,
    pools: Weak<Pools>,
    every: Duration,
) {
    background.spawn(
        "ferry-readiness",
        "/readyz answers from no snapshot",
        move |stop| loop {
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
            if !stop.wait(next) {
                return;
            }
        },
    );
}

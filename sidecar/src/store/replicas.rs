//! Postgres streaming replicas for plain reads (`[replicas]`), with read-your-writes.
//!
//! A monitor thread reads, every `poll_ms`, the primary's WAL position and each replica's
//! replayed position (`pg_last_wal_replay_lsn()`). A replay position only moves forward, so the
//! last one seen is a lower bound of where the replica is now: a read that carries a position
//! goes to a replica once a check has seen it past that position, and so it sees the write. A
//! replica's lag is how long ago the primary was first seen at a position the replica has not
//! replayed yet; past `max_lag_ms`, or not answering, or not in recovery (promoted), it is out
//! of use until a check finds it well again. Behind a pooler that shares its sessions (see
//! `own_sessions`), it is out of use for good.
//!
//! Only reads that skip the cache go to a replica: a cache fill from a lagging replica after an
//! invalidation would store the rows the invalidation removed, for every later reader. Fills,
//! writes and transactions stay on the primary.

use crate::config::{Config, ReplicaReads};
use crate::error::ApiError;
use crate::store::pools::{PgConn, PgPool};
use crate::store::postgres::own_sessions::{OwnSessions, Problem};
use crate::store::postgres::{pg_config, pg_tls, PgManager};
use ferry_shared::api::Position;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A metric: its name, its help text, and its value for one replica.
type Series = (&'static str, &'static str, fn(&Replica) -> String);

pub(crate) struct Replicas {
    list: Vec<Replica>,
    reads: ReplicaReads,
    max_lag: Duration,
    poll: Duration,
    /// Round robin over the replicas a read may use.
    next: AtomicUsize,
    /// Positions the primary was seen at, and when: how far behind a replica is, in time.
    history: Mutex<VecDeque<(Instant, u64)>>,
    /// Reads a replica failed, which the primary then answered.
    fallbacks: AtomicU64,
    /// Whether writes return their position: some read can use it (a replica, or the change
    /// stream's watermark for cached reads).
    positions: bool,
}

/// One replica: its pool and what the latest check saw.
pub(crate) struct Replica {
    pool: Option<PgPool>,
    /// Whether its sessions are Ferry's own (a pooler in between keeps it out of use for good).
    own: OwnSessions,
    /// The replay position last seen (a lower bound of where it is now).
    replayed: AtomicU64,
    /// Answered the latest check, in recovery, and within `max_lag_ms`.
    usable: AtomicBool,
    up: AtomicBool,
    lag_ms: AtomicU64,
    lag_bytes: AtomicU64,
    /// Reads it answered.
    reads: AtomicU64,
}

impl Replicas {
    /// The replicas' pools (connecting lazily: a replica down at startup is only out of use).
    pub(crate) fn new(config: &Config) -> Result<Replicas, ApiError> {
        let r = &config.replicas;
        let mut list = Vec::new();
        for url in &r.urls {
            let mut one = config.clone();
            one.postgres.url = url.clone();
            let own = OwnSessions::for_config(&one)?;
            let pool = r2d2::Pool::builder()
                .max_size(r.pool_size)
                .min_idle(Some(0))
                .connection_timeout(Duration::from_millis(config.postgres.checkout_timeout_ms))
                .test_on_check_out(false)
                // A replica down is routine (it is taken out of use): a warning, not an error.
                .error_handler(Box::new(crate::store::pools::LogErrors("replica")))
                .build_unchecked(PgManager::new(
                    pg_config(&one)?,
                    pg_tls(&config.postgres).map_err(ApiError::internal)?,
                    own.opened(),
                ));
            list.push(Replica {
                pool: Some(pool),
                own,
                replayed: AtomicU64::new(0),
                usable: AtomicBool::new(false),
                up: AtomicBool::new(false),
                lag_ms: AtomicU64::new(0),
                lag_bytes: AtomicU64::new(0),
                reads: AtomicU64::new(0),
            });
        }
        Ok(Replicas {
            list,
            reads: r.reads,
            max_lag: Duration::from_millis(r.max_lag_ms),
            poll: Duration::from_millis(r.poll_ms),
            next: AtomicUsize::new(0),
            history: Mutex::new(VecDeque::new()),
            fallbacks: AtomicU64::new(0),
            positions: !r.urls.is_empty() || config.changes.enabled,
        })
    }

    /// How long a read or a check waits for a replica's session: a few checks' time.
    pub(crate) fn wait(&self) -> Duration {
        (self.poll * 4).max(Duration::from_millis(200))
    }

    /// The replica a plain read may go to, or None for the primary: one in use whose replay
    /// was seen past `after`; without `after`, one in use only with `replicas.reads = "any"`.
    pub(crate) fn pick(&self, after: Option<Position>) -> Option<&Replica> {
        if self.list.is_empty() || (after.is_none() && self.reads != ReplicaReads::Any) {
            return None;
        }
        let need = after.map_or(0, |p| p.0);
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..self.list.len())
            .map(|i| &self.list[(start + i) % self.list.len()])
            .find(|r| {
                r.usable.load(Ordering::Acquire) && r.replayed.load(Ordering::Acquire) >= need
            })
    }

    /// A read a replica failed went to the primary.
    pub(crate) fn fell_back(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// The replicas' part of `/metrics` (nothing without replicas).
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        if self.list.is_empty() {
            return;
        }
        let gauges: [Series; 5] = [
            ("ferry_replica_up", "1 while the replica answers its checks.", |r| {
                u8::from(r.up.load(Ordering::Acquire)).to_string()
            }),
            ("ferry_replica_in_use", "1 while reads may go to the replica (up, in recovery, within replicas.max_lag_ms).", |r| {
                u8::from(r.usable.load(Ordering::Acquire)).to_string()
            }),
            ("ferry_replica_lag_seconds", "How long ago the primary was at a position the replica has not replayed yet.", |r| {
                format!("{:.3}", r.lag_ms.load(Ordering::Acquire) as f64 / 1000.0)
            }),
            ("ferry_replica_lag_bytes", "WAL the primary has written that the replica has not replayed.", |r| {
                r.lag_bytes.load(Ordering::Acquire).to_string()
            }),
            ("ferry_replica_reads_total", "Reads the replica answered.", |r| {
                r.reads.load(Ordering::Relaxed).to_string()
            }),
        ];
        for (name, help, value) in gauges {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (i, r) in self.list.iter().enumerate() {
                let _ = writeln!(out, "{name}{{replica=\"{i}\"}} {}", value(r));
            }
        }
        let _ = writeln!(
            out,
            "# HELP ferry_replica_fallbacks_total Reads a replica failed, answered by the primary.\n\
             # TYPE ferry_replica_fallbacks_total counter\nferry_replica_fallbacks_total {}",
            self.fallbacks.load(Ordering::Relaxed)
        );
    }

    /// Checks every replica now, then every `poll_ms` until the replicas are dropped.
    pub(crate) fn spawn_monitor(
        self: &Arc<Self>,
        background: &crate::background::Background,
        pools: Weak<crate::store::pools::Pools>,
    ) {
        if self.list.is_empty() {
            return;
        }
        let me = Arc::downgrade(self);
        background.every(
            "ferry-replicas",
            "no replica is used: reads go to the primary",
            self.poll,
            move || {
                let (Some(r), Some(p)) = (me.upgrade(), pools.upgrade()) else {
                    return false;
                };
                r.check(&p);
                true
            },
        );
    }

    fn check(&self, pools: &crate::store::pools::Pools) {
        let now = Instant::now();
        let primary = pools
            .pg_conn()
            .ok()
            .and_then(|mut c| lsn(&mut c, "SELECT pg_current_wal_lsn()::text"));
        let history = {
            let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = primary {
                if h.back().is_none_or(|&(_, last)| at > last) {
                    h.push_back((now, at));
                }
            }
            // Positions older than the lag bound only ever say "too far behind".
            let keep = self.max_lag * 2 + self.poll;
            while h.len() > 1 && h.front().is_some_and(|(t, _)| now - *t > keep) {
                h.pop_front();
            }
            h.clone()
        };
        for (i, r) in self.list.iter().enumerate() {
            if let Some(opened) = r.own.recheck_due() {
                if let (Ok(mut a), Ok(mut b)) = (r.get(self.wait()), r.get(self.wait())) {
                    let out = r.own.recheck_on(&mut a.client, &mut b.client, opened);
                    a.poisoned |= out.is_err();
                    b.poisoned |= out.is_err();
                }
            }
            match r.own.check() {
                Ok(()) => {}
                Err(Problem::Unreachable(_)) => {
                    r.set(false, false, 0, 0);
                    continue;
                }
                Err(Problem::NotOwn(_) | Problem::Unsafe(_)) => {
                    r.set(true, false, 0, 0);
                    continue;
                }
            }
            let seen = r.get(self.wait()).ok().map(|mut c| {
                text(
                    &mut c,
                    "SELECT COALESCE(pg_last_wal_replay_lsn()::text, 'primary')",
                )
            });
            let replayed = match seen.flatten() {
                None => {
                    r.set(false, false, 0, 0);
                    continue;
                }
                Some(at) => at.parse::<Position>().ok().map(|p| p.0),
            };
            let Some(replayed) = replayed else {
                tracing::warn!(
                    replica = i,
                    "replica is not in recovery: not used for reads"
                );
                r.set(true, false, 0, 0);
                continue;
            };
            r.replayed.fetch_max(replayed, Ordering::AcqRel);
            // Behind since the first primary position it has not replayed.
            let lag = history
                .iter()
                .find(|(_, at)| *at > replayed)
                .map_or(Duration::ZERO, |(t, _)| now - *t);
            let bytes = history
                .back()
                .map_or(0, |(_, at)| at.saturating_sub(replayed));
            r.set(true, lag <= self.max_lag, lag.as_millis() as u64, bytes);
        }
    }
}

impl Replica {
    fn set(&self, up: bool, usable: bool, lag_ms: u64, lag_bytes: u64) {
        self.up.store(up, Ordering::Release);
        self.usable.store(usable, Ordering::Release);
        self.lag_ms.store(lag_ms, Ordering::Release);
        self.lag_bytes.store(lag_bytes, Ordering::Release);
    }

    /// A pooled session on this replica, waiting at most `wait` (a replica that went down is
    /// skipped for the primary, not waited for).
    pub(crate) fn get(&self, wait: Duration) -> Result<PgConn, ApiError> {
        let pool = self
            .pool
            .as_ref()
            .ok_or_else(|| ApiError::internal("replica pool used after shutdown"))?;
        pool.get_timeout(wait)
            .map_err(|e| ApiError::DatabaseUnavailable {
                internal: format!("replica: {e}"),
            })
            .and_then(PgConn::checked_out)
    }

    pub(crate) fn served(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Out of use until the next check finds it well (a read on it failed).
    pub(crate) fn failed(&self) {
        self.usable.store(false, Ordering::Release);
    }
}

/// The one value a one-row, one-column query printed (None when it failed; a session whose
/// query failed is closed, not pooled).
fn text(conn: &mut PgConn, sql: &str) -> Option<String> {
    let rows = match conn.client.simple_query(sql) {
        Ok(rows) => rows,
        Err(_) => {
            conn.poisoned = true;
            return None;
        }
    };
    rows.iter().find_map(|m| match m {
        postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
        _ => None,
    })
}

fn lsn(conn: &mut PgConn, sql: &str) -> Option<u64> {
    text(conn, sql)?.parse::<Position>().ok().map(|p| p.0)
}

impl Replicas {
    /// What a write that has committed returns: where the primary's log is now, which is at
    /// or past every commit acknowledged before this call, on any session. None without
    /// replicas or the change stream (no read would use it), or when the primary does not
    /// say: the write stands, and a read without a position goes to the primary (unless
    /// `replicas.reads = "any"`).
    pub(crate) fn position_after_write(
        &self,
        pools: &crate::store::pools::Pools,
    ) -> Option<Position> {
        if !self.positions {
            return None;
        }
        let at = pools
            .pg_conn()
            .ok()
            .and_then(|mut c| lsn(&mut c, "SELECT pg_current_wal_insert_lsn()::text"));
        if at.is_none() {
            tracing::warn!("cannot read the primary's WAL position: the write returns none");
        }
        at.map(Position)
    }
}

/// The blocking client closes its connection on a runtime of its own, which panics inside
/// another runtime (see `Drop for Pools`): the pools are dropped on a plain thread.
impl Drop for Replicas {
    fn drop(&mut self) {
        let pools: Vec<PgPool> = self.list.iter_mut().filter_map(|r| r.pool.take()).collect();
        if pools.is_empty() {
            return;
        }
        if let Ok(h) = std::thread::Builder::new()
            .name("ferry-pg-close".into())
            .spawn(move || drop(pools))
        {
            let _ = h.join();
        }
    }
}

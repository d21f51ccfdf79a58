//! Change-stream invalidation: cached reads stay fresh after writes from any writer (psql,
//! migrations, cron jobs, other services), not only those sent through `/v1/execute`.
//!
//! Postgres's logical decoding (pgoutput, the plugin every managed Postgres offers) streams
//! each committed change of the watched tables through a durable slot; one sidecar at a time
//! (the holder of an advisory lock) reads it over the replication protocol, turns the changes
//! into invalidations (`deps.rs`), applies them to Redis, and only then confirms the slot's
//! position (`stream.rs`). Every sidecar gates its cached reads on the stream's watermark
//! (`store::cache::freshness`): the guarantee and its bound are stated there.
//!
//! Connections: each sidecar keeps one control session outside the pool (the lock, and for
//! the leader the slot, the marks and the DDL check) and the leader one replication
//! connection, so `postgres.pool_size` + 2 at most.

mod deps;
mod legacy;
mod pgoutput;
mod session;
mod setup;
mod stream;
mod visible;

pub use setup::SetupError;

use crate::config::Config;
use crate::metrics::Histogram;
use crate::store::cache::Cache;
use crate::store::pools::Pools;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// This sidecar's part in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Off,
    Starting,
    Follower,
    Leader,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Off => "off",
            Role::Starting => "starting",
            Role::Follower => "follower",
            Role::Leader => "leader",
        }
    }
}

/// What /readyz and /metrics report about the stream.
pub(crate) struct Status {
    role: AtomicU8,
    /// WAL bytes the slot holds back; -1 until measured (the leader measures it).
    slot_lag_bytes: AtomicI64,
    alert_lag_bytes: u64,
    changes: AtomicU64,
    applied: AtomicU64,
    apply_failures: AtomicU64,
    /// From a commit to its invalidations in Redis, in seconds.
    lag: Mutex<Histogram>,
}

impl Status {
    fn new(role: Role, alert_lag_bytes: u64) -> Status {
        let s = Status {
            role: AtomicU8::new(0),
            slot_lag_bytes: AtomicI64::new(-1),
            alert_lag_bytes,
            changes: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            apply_failures: AtomicU64::new(0),
            lag: Mutex::new(Histogram::default()),
        };
        s.set_role(role);
        s
    }

    pub(crate) fn role(&self) -> Role {
        match self.role.load(Ordering::Relaxed) {
            1 => Role::Starting,
            2 => Role::Follower,
            3 => Role::Leader,
            _ => Role::Off,
        }
    }

    fn set_role(&self, r: Role) {
        let v = match r {
            Role::Off => 0,
            Role::Starting => 1,
            Role::Follower => 2,
            Role::Leader => 3,
        };
        self.role.store(v, Ordering::Relaxed);
        if r != Role::Leader {
            self.slot_lag_bytes.store(-1, Ordering::Relaxed);
        }
    }

    fn set_slot_lag(&self, bytes: Option<i64>) {
        self.slot_lag_bytes
            .store(bytes.unwrap_or(-1), Ordering::Relaxed);
    }

    fn count_change(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
    }

    fn count_applied(&self, n: usize) {
        self.applied.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn count_apply_failure(&self) {
        self.apply_failures.fetch_add(1, Ordering::Relaxed);
    }

    fn observe_lag(&self, lags_ms: impl Iterator<Item = u64>) {
        let mut h = self.lag.lock().unwrap_or_else(|p| p.into_inner());
        for ms in lags_ms {
            h.observe(ms as f64 / 1000.0);
        }
    }

    /// Prometheus lines for the stream (with the watermark's age from the cache's gate).
    pub(crate) fn render(&self, cache: &Cache, out: &mut String) {
        let role = self.role();
        let _ = writeln!(
            out,
            "# HELP ferry_changes_leader 1 while this sidecar consumes the change stream.\n\
             # TYPE ferry_changes_leader gauge\nferry_changes_leader {}",
            u8::from(role == Role::Leader)
        );
        let (state, age) = cache.freshness().state();
        let _ = writeln!(
            out,
            "# HELP ferry_changes_lag_seconds How far cached reads may trail commits: the age of the stream's watermark (-1: none yet).\n\
             # TYPE ferry_changes_lag_seconds gauge\nferry_changes_lag_seconds {}",
            age.map_or(-1.0, |ms| ms as f64 / 1000.0)
        );
        let _ = writeln!(
            out,
            "# HELP ferry_changes_caught_up 1 while cached reads are served (the stream is within changes.max_lag_ms).\n\
             # TYPE ferry_changes_caught_up gauge\nferry_changes_caught_up {}",
            u8::from(state == crate::store::cache::StreamState::CaughtUp)
        );
        let slot = self.slot_lag_bytes.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP ferry_changes_slot_lag_bytes WAL the slot holds back on the database's disk (leader only; -1 elsewhere).\n\
             # TYPE ferry_changes_slot_lag_bytes gauge\nferry_changes_slot_lag_bytes {slot}\n\
             # HELP ferry_changes_slot_lag_alert 1 when the slot holds back more than changes.alert_lag_bytes.\n\
             # TYPE ferry_changes_slot_lag_alert gauge\nferry_changes_slot_lag_alert {}",
            u8::from(slot >= 0 && slot as u64 > self.alert_lag_bytes)
        );
        let _ = writeln!(
            out,
            "# HELP ferry_changes_total Row changes read from the stream.\n\
             # TYPE ferry_changes_total counter\nferry_changes_total {}\n\
             # HELP ferry_changes_invalidated_total Keys and tags invalidated from the stream.\n\
             # TYPE ferry_changes_invalidated_total counter\nferry_changes_invalidated_total {}\n\
             # HELP ferry_changes_apply_failures_total Rounds of invalidations Redis did not take (retried).\n\
             # TYPE ferry_changes_apply_failures_total counter\nferry_changes_apply_failures_total {}",
            self.changes.load(Ordering::Relaxed),
            self.applied.load(Ordering::Relaxed),
            self.apply_failures.load(Ordering::Relaxed)
        );
        out.push_str("# HELP ferry_changes_invalidation_seconds From a commit to its invalidations in Redis.\n# TYPE ferry_changes_invalidation_seconds histogram\n");
        self.lag.lock().unwrap_or_else(|p| p.into_inner()).render(
            out,
            "ferry_changes_invalidation_seconds",
            "",
        );
    }
}

/// The stream's status; starts the consumer thread when `[changes]` is on. The thread stops
/// once the cache and pools are dropped.
pub(crate) fn start(
    config: &Config,
    cache: &Arc<Cache>,
    pools: &Arc<Pools>,
    background: &crate::background::Background,
) -> Arc<Status> {
    let c = &config.changes;
    if !c.enabled {
        return Arc::new(Status::new(Role::Off, c.alert_lag_bytes));
    }
    let status = Arc::new(Status::new(Role::Starting, c.alert_lag_bytes));
    let ctx = stream::Ctx {
        config: Arc::new(config.stream_config()),
        cache: Arc::downgrade(cache),
        pools: Arc::downgrade(pools),
        status: status.clone(),
        watched: deps::Watched::from_config(config),
    };
    background.spawn(
        "ferry-changes",
        "no change stream: cached reads bypass once its watermark ages",
        // Its blocking work (the watermark, the pooled path) on threads named after it too.
        move |stop| match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("ferry-changes-io")
            .build()
        {
            // The stream ends with the state it serves; at shutdown, with the sidecar.
            Ok(rt) => rt.block_on(async {
                tokio::select! {
                    _ = stream::run(ctx) => {}
                    _ = until_stopped(&stop) => {}
                }
            }),
            Err(e) => tracing::error!(error = %e, "change stream: no runtime"),
        },
    );
    status
}

/// Resolves once the sidecar is stopping (checked ten times a second).
async fn until_stopped(stop: &crate::background::Stop) {
    while !stop.stopping() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The startup check: with `[changes]` on, the server and role must allow logical decoding
/// and every watched table must exist. Err(Connect) when Postgres cannot be reached (the
/// sidecar then starts, and reads bypass the cache until the stream runs).
pub fn check(config: &Config) -> Result<(), SetupError> {
    if !config.changes.enabled {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SetupError::Connect(e.to_string()))?;
    let watched: Vec<String> = config.watched_tables().into_iter().collect();
    let config = config.stream_config();
    rt.block_on(async {
        let client = setup::connect(&config).await?;
        setup::check(&client, &watched).await
    })
}

//! The probe again, on two of the pool's own sessions. A verdict holds for the sessions the
//! probe saw, and the pools open new ones as they go (a failover, a session killed, a pooler
//! put in between, a DNS name moved). Asked on sessions the pool already holds, the probe opens
//! no connection of its own, so `postgres.pool_size` bounds the connections as before. The
//! sessions are blocking ones: `ask` gives up after `WAIT` by cancelling its query, as the
//! first probe's timeout does.

use super::probe::{marked, probe_sessions, problem, Session};
use super::probe::{MARK_SQL, READ_MARK_SQL, SETTINGS_SQL, WAIT};
use super::{OwnSessions, Problem, NOT_OWN, OWN};
use futures_util::FutureExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The least time between two probes again: a pool that keeps replacing connections
/// (timeouts, killed sessions) would ask for one every readiness tick. Also about the longest
/// a pooler put in between goes unnoticed (measured: `tests/pooler_swapped_in.rs`).
const RECHECK_EVERY: Duration = Duration::from_secs(1);

impl OwnSessions {
    /// Whether the sessions are to be probed again: they were found Ferry's own, the pools
    /// have opened connections since, and the last probe again is [`RECHECK_EVERY`] old. Gives
    /// the count of connections opened as the probe begins (for [`OwnSessions::recheck_on`]).
    pub(crate) fn recheck_due(&self) -> Option<u64> {
        let opened = self.opened.load(Ordering::Acquire);
        if self.verdict.load(Ordering::Acquire) != OWN
            || opened == self.probed_through.load(Ordering::Acquire)
        {
            return None;
        }
        let mut last = self.rechecked.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < RECHECK_EVERY) {
            return None;
        }
        *last = Some(Instant::now());
        Some(opened)
    }

    /// Probes again on `a` and `b`, two sessions checked out of the pool (serving goes on
    /// meanwhile). Found not Ferry's own, the gate closes for good; not answered, it is asked
    /// again later. Ok: the probe's mark is taken off both; an error leaves them for the
    /// caller to discard.
    pub(crate) fn recheck_on(
        &self,
        a: &mut postgres::Client,
        b: &mut postgres::Client,
        opened: u64,
    ) -> Result<(), Problem> {
        let (mut a, mut b) = (self.pooled(a), self.pooled(b));
        let probed = probe_sessions(&mut a, &mut b, self.wants_statement_timeout)
            .now_or_never()
            .unwrap_or_else(|| Err(Problem::Unreachable("the probe did not finish".into())));
        let out = probed.and_then(|()| {
            for s in [a.client, b.client] {
                s.batch_execute("RESET ferry.own_session")
                    .map_err(problem)?;
            }
            Ok(())
        });
        if matches!(out, Err(Problem::NotOwn(_))) && self.verdict.load(Ordering::Acquire) != NOT_OWN
        {
            tracing::error!(
                "the sessions were probed again, after the pools opened new connections"
            );
        }
        self.settle(out, opened)
    }

    fn pooled<'a>(&self, client: &'a mut postgres::Client) -> Pooled<'a> {
        Pooled {
            client,
            tls: self.tls.clone(),
        }
    }
}

/// A session of the pool, for the probe.
struct Pooled<'a> {
    client: &'a mut postgres::Client,
    tls: MakeRustlsConnect,
}

impl Session for Pooled<'_> {
    async fn ask(&mut self, set: Option<&str>) -> Result<Option<(i32, Option<String>)>, Problem> {
        // A pooler with no backend free makes the query wait: cancelled after WAIT.
        let (cancel, tls) = (self.client.cancel_token(), self.tls.clone());
        let (answered, wait) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            let late = wait.recv_timeout(WAIT).is_err();
            if late {
                let _ = cancel.cancel_query(tls);
            }
            late
        });
        let row = match set {
            Some(token) => self.client.query_one(MARK_SQL, &[&token]),
            None => self.client.query_one(READ_MARK_SQL, &[]),
        };
        let _ = answered.send(());
        if watchdog.join().unwrap_or(true) && row.is_err() {
            return Ok(None);
        }
        marked(&row.map_err(problem)?).map(Some)
    }

    async fn exec(&mut self, sql: &str) -> Result<(), Problem> {
        self.client.batch_execute(sql).map_err(problem)
    }

    async fn settings(&mut self) -> Result<[String; 3], Problem> {
        let row = self.client.query_one(SETTINGS_SQL, &[]).map_err(problem)?;
        Ok([0, 1, 2].map(|i| row.try_get::<_, String>(i).unwrap_or_default()))
    }
}

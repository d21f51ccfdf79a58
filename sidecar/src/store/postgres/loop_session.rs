//! Postgres sessions on the worker's own event loop, for plain reads: no thread hop, no pool
//! lock. Each actix worker keeps its own few connections (the async driver under `postgres`,
//! its connection task spawned on that worker), so a read is sent, awaited and decoded on the
//! thread that received the request, like a cache hit.
//!
//! Bounds: at most `per_worker` sessions per worker, and at most `workers` threads ever hold
//! any, so these connections never pass `per_worker * workers`; together with the r2d2 pool's
//! they stay within `postgres.pool_size`. A read on a worker whose sessions are all in use waits
//! in line (first come, first served) for one of them, up to the checkout timeout. One that
//! has waited [`SPILL_AFTER`] takes the pooled path instead when that has a connection to
//! spare, and asks again every [`SPILL_AFTER`] while it waits: slow statements hold its
//! worker's sessions, or more reads arrive than they serve. Under a load they do serve, a read
//! waits less than that and stays on its event loop. Taking the pooled path whenever the
//! worker's sessions were all out sent 12-20% of the bench's uncached reads through its thread
//! hop, for about a fifth more sidecar CPU per read in the pinned run
//! (`bench/results/experiments/2026-12-06-wait-in-line.md`).
//!
//! A session is reset (`DISCARD ALL`) after each request exactly like a pooled one, and one whose
//! reset failed, whose result was abandoned, or whose connection closed is dropped, never reused.
//!
//! A session dropped in the middle of its work (the request's deadline passed, its caller went
//! away) keeps its slot until its backend is gone: the statement is cancelled (CancelRequest),
//! the connection closed, and its end awaited. Closing alone would leave the backend running
//! whatever it was running (a caller may lift its own `statement_timeout`), beside the new
//! connection that the freed slot would open: the bound would hold for connections, not for
//! the backends Ferry causes.
//!
//! The one state a session keeps between requests: the operator's `skip_reset` statements,
//! prepared on it ([`Prepared`]), so that their runs skip Postgres's parse and plan as well as
//! the reset. They go (each closed, in order, ahead of what is sent next) when the session is
//! taken for any other kind of request (`session`'s `keep_prepared`), and with every reset.

use crate::error::ApiError;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_postgres::{Client, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Statements prepared on one connection, by their SQL (see the module's doc).
pub(crate) type Prepared = HashMap<Arc<str>, Statement>;

pub(crate) struct AsyncPg {
    /// Tells this sidecar's sessions apart from another's on the same thread (tests).
    id: u64,
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    per_worker: usize,
    workers: usize,
    /// Threads that have taken a share so far (at most `workers`).
    threads: AtomicUsize,
    /// Shares of an `AsyncPg` that is gone are dropped, with their connections, on the next
    /// use of that thread.
    alive: Arc<()>,
    counts: Arc<Counts>,
    /// Every connection opened, counted for the sessions' probe (`OwnSessions::opened`).
    opened: Arc<AtomicU64>,
}

/// Connections open and idle over all the workers' shares, for `/metrics`.
#[derive(Default)]
struct Counts {
    open: AtomicUsize,
    idle: AtomicUsize,
}

impl Counts {
    fn less(n: &AtomicUsize, by: usize) {
        let _ = n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_sub(by))
        });
    }
}

/// One open connection: the client, and the task that drives it (it ends once the server has
/// closed the connection).
pub(crate) struct Link {
    pub client: Client,
    task: tokio::task::JoinHandle<()>,
}

/// How long a read waits in line for its worker's session before it may take the pooled path
/// (see the module's doc): longer than any read waited under the bench's loads (none took the
/// pooled path; a whole request took 3 ms on average pinned), short next to a slow statement.
pub(crate) const SPILL_AFTER: Duration = Duration::from_millis(10);

/// One worker's share: its idle connections, and a permit for each of its sessions not out
/// (fair: a session given back goes to the read that has waited longest).
struct Share {
    id: u64,
    owner: Weak<()>,
    idle: Vec<(Link, Prepared)>,
    permits: Rc<Semaphore>,
}

thread_local! {
    static SHARES: RefCell<Vec<Share>> = const { RefCell::new(Vec::new()) };
}

/// A session checked out on this worker. Dropped: its connection goes back to the worker's
/// idle list if it was reset for reuse and is still open; otherwise it is closed.
pub(crate) struct AsyncSession {
    pub client: Option<Client>,
    /// The task driving `client`'s connection.
    task: Option<tokio::task::JoinHandle<()>>,
    /// For the CancelRequest of a session dropped mid-work, and how long its end is awaited.
    tls: MakeRustlsConnect,
    wait: Duration,
    /// The `skip_reset` statements prepared on this connection, by their SQL.
    pub prepared: Prepared,
    /// Set once the session has been reset after its request: a session dropped before that
    /// (an error, an abandoned result, a request timeout mid-query) is closed, never reused.
    pub reusable: bool,
    id: u64,
    counts: Arc<Counts>,
    _not_send: std::marker::PhantomData<Rc<()>>,
}

impl AsyncPg {
    /// `(per_worker, workers)`: the bounds (see the module's doc); `opened` counts the
    /// connections opened (`OwnSessions::opened`).
    pub(crate) fn new(
        config: tokio_postgres::Config,
        tls: MakeRustlsConnect,
        (per_worker, workers): (usize, usize),
        opened: Arc<AtomicU64>,
    ) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(0);
        AsyncPg {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            config,
            tls,
            per_worker,
            workers,
            threads: AtomicUsize::new(0),
            alive: Arc::new(()),
            counts: Arc::default(),
            opened,
        }
    }

    /// The most sessions one worker holds.
    pub(crate) fn per_worker(&self) -> usize {
        self.per_worker
    }

    /// The most connections these sessions can hold open.
    pub(crate) fn max(&self) -> usize {
        self.per_worker * self.workers
    }

    /// (open, idle) connections of all the workers' sessions.
    pub(crate) fn state(&self) -> (usize, usize) {
        (
            self.counts.open.load(Ordering::Acquire),
            self.counts.idle.load(Ordering::Acquire),
        )
    }

    /// A session on this worker, or None when this thread has no share (sessions are off, or
    /// it is not one of the workers), or when it has waited in line [`SPILL_AFTER`] (or a
    /// multiple) and `elsewhere` says the pooled path has room. Otherwise it waits for one of
    /// its share to be given back, up to `checkout_timeout` (then 503 `overloaded`, as the pool
    /// answers).
    pub(crate) async fn session(
        &self,
        connect_timeout: Duration,
        checkout_timeout: Duration,
        elsewhere: impl Fn() -> bool,
        keep_prepared: bool,
    ) -> Result<Option<AsyncSession>, ApiError> {
        if self.per_worker == 0 {
            return Ok(None);
        }
        let Some(permits) = self.share() else {
            return Ok(None);
        };
        let permit = match permits.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                let now = tokio::time::Instant::now();
                let (deadline, mut ask) = (now + checkout_timeout, now + SPILL_AFTER);
                // Its place in line is kept while the pooled path is asked.
                let in_line = permits.acquire();
                tokio::pin!(in_line);
                loop {
                    let until = ask.min(deadline);
                    match tokio::time::timeout_at(until, &mut in_line).await {
                        Ok(Ok(permit)) => break permit,
                        // Never closed while the share is there.
                        Ok(Err(_)) => return Ok(None),
                        Err(_) if until == deadline => {
                            return Err(ApiError::Overloaded {
                                what: "postgres pool",
                            })
                        }
                        Err(_) if elsewhere() => {
                            let spilled = &crate::metrics::global().pg_reads_spilled;
                            spilled.fetch_add(1, Ordering::Relaxed);
                            return Ok(None);
                        }
                        Err(_) => ask = until + SPILL_AFTER,
                    }
                }
            }
        };
        // Given back by the session's drop (`give_back`), not by the permit's.
        permit.forget();
        let idle = self.idle();
        let (link, prepared) = idle.unzip();
        let (client, task) = link.map(|l| (l.client, l.task)).unzip();
        let mut session = AsyncSession {
            client,
            task,
            tls: self.tls.clone(),
            // The backend of a cancelled statement ends within moments; one that does not (a
            // frozen server runs nothing) gives its slot back after this long all the same.
            wait: checkout_timeout.max(connect_timeout),
            // Dropped here unless kept: each is closed ahead of anything the session sends.
            prepared: prepared.filter(|_| keep_prepared).unwrap_or_default(),
            reusable: false,
            id: self.id,
            counts: self.counts.clone(),
            _not_send: std::marker::PhantomData,
        };
        if session.client.is_none() {
            let link = self.connect(connect_timeout).await?;
            session.client = Some(link.client);
            session.task = Some(link.task);
        }
        Ok(Some(session))
    }

    /// This worker's share's permits (joining, if there is room, on first use); None when this
    /// thread has no share.
    fn share(&self) -> Option<Rc<Semaphore>> {
        SHARES.with(|s| {
            let mut shares = s.borrow_mut();
            shares.retain(|x| x.owner.strong_count() > 0);
            let i = match shares.iter().position(|x| x.id == self.id) {
                Some(i) => i,
                None => {
                    let joined =
                        self.threads
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                                (n < self.workers).then_some(n + 1)
                            });
                    if joined.is_err() {
                        return None;
                    }
                    shares.push(Share {
                        id: self.id,
                        owner: Arc::downgrade(&self.alive),
                        idle: Vec::new(),
                        permits: Rc::new(Semaphore::new(self.per_worker)),
                    });
                    shares.len() - 1
                }
            };
            Some(shares[i].permits.clone())
        })
    }

    /// An idle connection of this worker's share, for a session whose permit was taken.
    fn idle(&self) -> Option<(Link, Prepared)> {
        SHARES.with(|s| {
            let mut shares = s.borrow_mut();
            let share = shares.iter_mut().find(|x| x.id == self.id)?;
            // Connections closed while idle (Postgres restarted) are dropped on the way.
            let before = share.idle.len();
            share.idle.retain(|(l, _)| !l.client.is_closed());
            let closed = before - share.idle.len();
            Counts::less(&self.counts.open, closed);
            Counts::less(&self.counts.idle, closed);
            let idle = share.idle.pop();
            if idle.is_some() {
                Counts::less(&self.counts.idle, 1);
            }
            idle
        })
    }

    async fn connect(&self, timeout: Duration) -> Result<Link, ApiError> {
        let unavailable = |internal: String| ApiError::DatabaseUnavailable { internal };
        let (client, connection) =
            tokio::time::timeout(timeout, self.config.connect(self.tls.clone()))
                .await
                .map_err(|_| unavailable("connect timeout".into()))?
                .map_err(|e| unavailable(e.to_string()))?;
        // The connection task lives on this worker; it ends when the client is dropped.
        let task = actix_rt::spawn(async move {
            let _ = connection.await;
        });
        // Within the connect's own bound: a session that did not learn them still serves.
        let _ = tokio::time::timeout(timeout, super::user_types::learn_async(&client)).await;
        self.counts.open.fetch_add(1, Ordering::AcqRel);
        self.opened.fetch_add(1, Ordering::AcqRel);
        Ok(Link { client, task })
    }
}

/// Gives a slot of share `id` back (waking one waiter), with its connection when it is kept.
fn give_back(id: u64, kept: Option<(Link, Prepared)>, counts: &Counts) {
    let _ = SHARES.try_with(|s| {
        let mut shares = s.borrow_mut();
        if let Some(share) = shares.iter_mut().find(|x| x.id == id) {
            // The connection first: the read the permit wakes finds it idle.
            if let Some(kept) = kept {
                share.idle.push(kept);
                counts.idle.fetch_add(1, Ordering::AcqRel);
            }
            share.permits.add_permits(1);
        }
    });
}

impl Drop for AsyncSession {
    fn drop(&mut self) {
        let (client, task) = (self.client.take(), self.task.take());
        let (Some(client), Some(task)) = (client, task) else {
            // A session whose connect failed gives its slot back all the same: else every
            // failed connect of an outage would keep a slot of the share for good.
            give_back(self.id, None, &self.counts);
            return;
        };
        if self.reusable && !client.is_closed() {
            let prepared = std::mem::take(&mut self.prepared);
            give_back(
                self.id,
                Some((Link { client, task }, prepared)),
                &self.counts,
            );
            return;
        }
        let counts = self.counts.clone();
        if client.is_closed() || tokio::runtime::Handle::try_current().is_err() {
            // Nothing runs on it any more (or no runtime is left to wait on: shutdown).
            drop(client);
            Counts::less(&counts.open, 1);
            give_back(self.id, None, &counts);
            return;
        }
        // Dropped mid-work: the slot is held until the backend is gone (see the module doc).
        let (id, tls, wait) = (self.id, self.tls.clone(), self.wait);
        actix_rt::spawn(async move {
            let token = client.cancel_token();
            let _ = tokio::time::timeout(wait, token.cancel_query(tls)).await;
            // Dropping the client ends the connection once the cancelled statement has
            // answered; the task ends when the server has closed it.
            drop(client);
            let _ = tokio::time::timeout(wait, task).await;
            Counts::less(&counts.open, 1);
            give_back(id, None, &counts);
        });
    }
}

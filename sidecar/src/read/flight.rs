//! Single-flight: concurrent misses on one cache key run one Postgres query; the others wait
//! for it (bounded by the request timeout) and share its result.
//!
//! Waiters hold no blocking thread and no in-flight slot: they await a watch channel. The work
//! runs in a task of its own, so it finishes (and wakes the waiters) even if the request that
//! started it goes away. An invalidation forgets the flights it concerns, so a read that starts
//! after an acknowledged write never joins a flight that began before it.

use crate::error::ApiError;
use crate::store::cache::Rows;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// What a flight produced: the rows, and whether they were too large to cache.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub rows: Rows,
    pub too_large: bool,
    /// The fill's lease was released behind its write-back (`shared_flight`), or will be: the
    /// write-back's task holds it.
    pub released: bool,
    /// The write-back, sent after the answer: signalled once Redis has answered it. The flight
    /// stays joinable until then, so a read of this sidecar that comes meanwhile is answered
    /// from the fill instead of missing again.
    pub landed: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Found in Redis (looked up again behind the lease, or after another sidecar's fill),
    /// this old: Postgres was not asked.
    pub cached_age_ms: Option<u64>,
}

pub(crate) type Outcome = Result<Arc<Fetched>, ApiError>;

/// Which flight of its key (with the versions its lookup saw) a read may join.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Join {
    Any,
    /// Only one still running its query: a no-cache read, which asked for rows read after it.
    Unanswered,
    /// None: the read holds its fill lease (taken in its lookup). Joining would let the lease
    /// go with nobody filling under it, and a flight of this sidecar that waits on it would
    /// wake to no entry. It fills, and that flight wakes to its entry.
    Never,
}

struct Flight {
    id: u64,
    /// The versions its leader's lookup saw (`Observed::seen`): a read joins only a flight
    /// whose lookup saw what its own did, so none that began before an invalidation it saw.
    seen: String,
    /// When it answered (None while its query runs).
    answered_at: Arc<Mutex<Option<std::time::Instant>>>,
    /// The cache key it fills (what invalidation names).
    key: String,
    tags: Vec<String>,
    tx: Arc<watch::Sender<Option<Outcome>>>,
}

#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<HashMap<String, Flight>>,
    next_id: AtomicU64,
    /// Requests that waited on another's query instead of running their own.
    joined: AtomicU64,
}

impl Flights {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Flight>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the flight `identity`, or starts one running `work`, and waits for the outcome.
    /// `identity` is everything the result depends on (key, statement, parameters, tags), so
    /// reads that differ in any of them never share rows; `key` and `tags` are what
    /// invalidation names; `seen` the versions this read's lookup saw. The age: the flight had
    /// already answered when this read joined it (its write-back under way), this many ms ago,
    /// so this read was answered as from the cache. `join`: which flights this read may join.
    pub(crate) async fn run<F, Fut>(
        self: &Arc<Self>,
        (identity, seen): (&str, &str),
        key: &str,
        tags: &[String],
        (timeout, join): (Duration, Join),
        work: F,
    ) -> (Outcome, Option<u64>)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched, ApiError>> + 'static,
    {
        let (mut rx, answered) = self.join_or_start((identity, seen), key, tags, join, work);
        let waited = tokio::time::timeout(timeout, async {
            // Joined after the answer: answered once the entry is in Redis (or its write-back
            // gave up), as a hit found there would be.
            if answered.is_some() {
                let _ = rx.changed().await;
            }
            rx.wait_for(|v| v.is_some()).await.map(|v| v.clone())
        })
        .await;
        let outcome = match waited {
            Err(_) => Err(ApiError::Timeout {
                what: "the shared postgres query",
            }),
            Ok(Err(_)) => Err(ApiError::internal("single-flight leader vanished")),
            Ok(Ok(v)) => {
                v.unwrap_or_else(|| Err(ApiError::internal("single-flight without outcome")))
            }
        };
        (outcome, answered)
    }

    /// Starts `work` for `key` unless a flight for it is already running; does not wait.
    /// Used by stale-while-revalidate, so one refresh runs however many reads see it stale.
    pub(crate) fn start<F, Fut>(
        self: &Arc<Self>,
        (identity, seen): (&str, &str),
        (key, tags): (&str, &[String]),
        join: Join,
        work: F,
    ) where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched, ApiError>> + 'static,
    {
        drop(
            self.join_or_start((identity, seen), key, tags, join, work)
                .0,
        );
    }

    /// The flight to wait on, and how long ago it answered when it already had (the joiner is
    /// then answered as from the cache). A flight of other versions, or one that has answered
    /// `join` does not allow, is replaced, left to the reads it has.
    fn join_or_start<F, Fut>(
        self: &Arc<Self>,
        (identity, seen): (&str, &str),
        key: &str,
        tags: &[String],
        join: Join,
        work: F,
    ) -> (watch::Receiver<Option<Outcome>>, Option<u64>)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched, ApiError>> + 'static,
    {
        let mut map = self.map();
        if let Some(f) = map.get(identity).filter(|f| f.seen == seen) {
            let answered = *f.answered_at.lock().unwrap_or_else(|p| p.into_inner());
            let may = match join {
                Join::Any => true,
                Join::Unanswered => answered.is_none(),
                Join::Never => false,
            };
            if may {
                self.joined.fetch_add(1, Ordering::Relaxed);
                crate::metrics::global()
                    .flights_joined
                    .fetch_add(1, Ordering::Relaxed);
                let age_ms = answered.map(|at| at.elapsed().as_millis() as u64);
                return (f.tx.subscribe(), age_ms);
            }
        }
        let (tx, rx) = watch::channel(None);
        let tx = Arc::new(tx);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let answered_at = Arc::new(Mutex::new(None));
        map.insert(
            identity.to_string(),
            Flight {
                id,
                seen: seen.to_string(),
                answered_at: answered_at.clone(),
                key: key.to_string(),
                tags: tags.to_vec(),
                tx: tx.clone(),
            },
        );
        drop(map);
        let fut = work();
        let flights = self.clone();
        let identity = identity.to_string();
        actix_web::rt::spawn(async move {
            let (outcome, landed) = match fut.await {
                Ok(mut fetched) => {
                    let landed = fetched.landed.take();
                    (Ok(Arc::new(fetched)), landed)
                }
                Err(e) => (Err(e), None),
            };
            *answered_at.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(std::time::Instant::now());
            tx.send_replace(Some(outcome));
            // Joinable until the entry is in Redis (or its write-back gave up).
            if let Some(landed) = landed {
                let _ = landed.await;
            }
            let mut map = flights.map();
            // Under the map's lock, which joiners subscribe under: each one that joined after
            // the answer is woken by this.
            tx.send_modify(|_| {});
            if map.get(&identity).is_some_and(|f| f.id == id) {
                map.remove(&identity);
            }
        });
        (rx, None)
    }

    /// Forgets the flights of these keys and tags: later reads start fresh ones. Those already
    /// waiting keep theirs (they started before the write was acknowledged).
    pub(crate) fn forget(&self, keys: &[String], tags: &[String]) {
        if keys.is_empty() && tags.is_empty() {
            return;
        }
        self.map()
            .retain(|_, f| !keys.contains(&f.key) && !f.tags.iter().any(|t| tags.contains(t)));
    }

    /// How many requests shared another request's query so far.
    pub(crate) fn joined(&self) -> u64 {
        self.joined.load(Ordering::Relaxed)
    }
}

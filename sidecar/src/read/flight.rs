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

struct Flight {
    id: u64,
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
    /// invalidation names. The flag: the flight had already answered when this read joined it
    /// (its write-back was under way), so this read was answered as from the cache.
    pub(crate) async fn run<F, Fut>(
        self: &Arc<Self>,
        identity: &str,
        key: &str,
        tags: &[String],
        timeout: Duration,
        work: F,
    ) -> (Outcome, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched, ApiError>> + 'static,
    {
        let (mut rx, answered) = self.join_or_start(identity, key, tags, work);
        let waited = tokio::time::timeout(timeout, rx.wait_for(|v| v.is_some()))
            .await
            .map(|r| r.map(|v| v.clone()));
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
        identity: &str,
        key: &str,
        tags: &[String],
        work: F,
    ) where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched, ApiError>> + 'static,
    {
        drop(self.join_or_start(identity, key, tags, work).0);
    }

    fn join_or_start<F, Fut>(
        self: &Arc<Self>,
        identity: &str,
        key: &str,
        tags: &[String],
        work: F,
    ) -> (watch::Receiver<Option<Outcome>>, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Fetched, ApiError>> + 'static,
    {
        let mut map = self.map();
        if let Some(f) = map.get(identity) {
            self.joined.fetch_add(1, Ordering::Relaxed);
            crate::metrics::global()
                .flights_joined
                .fetch_add(1, Ordering::Relaxed);
            let answered = f.tx.borrow().is_some();
            return (f.tx.subscribe(), answered);
        }
        let (tx, rx) = watch::channel(None);
        let tx = Arc::new(tx);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        map.insert(
            identity.to_string(),
            Flight {
                id,
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
            tx.send_replace(Some(outcome));
            // Joinable until the entry is in Redis (or its write-back gave up).
            if let Some(landed) = landed {
                let _ = landed.await;
            }
            let mut map = flights.map();
            if map.get(&identity).is_some_and(|f| f.id == id) {
                map.remove(&identity);
            }
        });
        (rx, false)
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

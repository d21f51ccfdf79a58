//! The rule for blocking work: it never runs on an actix worker.

use crate::error::ApiError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Runs blocking work (pool checkouts, Redis, Postgres) on the blocking thread pool, never on
/// an actix worker. Bounded twice: at most `max_in_flight` jobs at once (beyond: 503 at once,
/// not a queue), and each job's answer is awaited at most `timeout` (beyond: 504, and the
/// Postgres statements the job is running are cancelled: `store::postgres::deadline`). The job keeps its
/// in-flight slot until it ends, so the bound holds.
#[derive(Clone)]
pub(crate) struct Blocking {
    slots: Arc<Semaphore>,
    timeout: Duration,
}

impl Blocking {
    pub(crate) fn new(max_in_flight: usize, timeout: Duration) -> Self {
        Blocking {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            timeout,
        }
    }

    /// How long a job's answer is awaited (the request deadline).
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// An in-flight slot for work done on the event loop instead (the same bound, the same
    /// 503 when it is full); held until dropped.
    pub(crate) fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded {
                what: "in-flight limit",
            })
    }

    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        self.run_until(tokio::time::Instant::now() + self.timeout, f)
            .await
    }

    /// [`Blocking::run`] for what is left of a request's deadline: work that first waited
    /// elsewhere (a read in line for its worker's session) gets no new one.
    pub(crate) async fn run_until<T, F>(
        &self,
        until: tokio::time::Instant,
        f: F,
    ) -> Result<T, ApiError>
    where
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let slot = self.admit()?;
        let deadline = Arc::new(crate::store::postgres::deadline::Deadline::default());
        let watched = deadline.clone();
        let job = actix_web::web::block(move || {
            let _slot = slot;
            watched.enter(f)
        });
        match tokio::time::timeout_at(until, job).await {
            Err(_) => {
                // The work ends too, not just the wait for it (`store::postgres::deadline`).
                actix_web::rt::task::spawn_blocking(move || deadline.expire());
                Err(ApiError::Timeout {
                    what: "the request",
                })
            }
            Ok(Err(e)) => Err(ApiError::internal(format!("blocking task failed: {e}"))),
            Ok(Ok(result)) => result,
        }
    }
}

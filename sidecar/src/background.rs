//! Every background task of the sidecar, started one way and stopped in one place: named
//! threads (the change stream, the replica monitor, the readiness probe, the deferred
//! invalidations, the nonce sweeper, the transaction reaper, the fill wake-ups), each ending
//! when the state it serves is dropped or when `shutdown` is called. `/metrics` and the log
//! name them; a task that cannot start is logged with what it costs.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a task waits on between its rounds: the period, or the shutdown, whichever comes first.
#[derive(Default)]
pub(crate) struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Waits `period`; false once the sidecar is stopping (the task should return).
    pub(crate) fn wait(&self, period: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let (stopped, _) = self
            .wake
            .wait_timeout_while(guard, period, |stopped| !*stopped)
            .unwrap_or_else(|p| p.into_inner());
        !*stopped
    }

    /// Whether the sidecar is stopping.
    pub(crate) fn stopping(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The running tasks.
#[derive(Default)]
pub(crate) struct Background {
    stop: Arc<Stop>,
    running: Mutex<Vec<(&'static str, JoinHandle<()>)>>,
}

impl Background {
    /// Starts `body` on a thread named `name`; `what_if_not` says what is lost when the thread
    /// cannot be started (logged).
    pub(crate) fn spawn(
        &self,
        name: &'static str,
        what_if_not: &'static str,
        body: impl FnOnce(Arc<Stop>) + Send + 'static,
    ) {
        let stop = self.stop.clone();
        match std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(stop))
        {
            Ok(handle) => self.lock().push((name, handle)),
            Err(e) => tracing::error!(task = name, error = %e, "cannot start: {what_if_not}"),
        }
    }

    /// Runs `round` now and then every `period` until it returns false (what it serves is
    /// gone) or the sidecar stops.
    pub(crate) fn every(
        &self,
        name: &'static str,
        what_if_not: &'static str,
        period: Duration,
        mut round: impl FnMut() -> bool + Send + 'static,
    ) {
        self.spawn(
            name,
            what_if_not,
            move |stop| {
                while round() && stop.wait(period) {}
            },
        );
    }

    /// Asks every task to stop, and waits up to `within` for them; names those still running.
    pub(crate) fn shutdown(&self, within: Duration) {
        *self.stop.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.stop.wake.notify_all();
        let deadline = Instant::now() + within;
        let running = std::mem::take(&mut *self.lock());
        for (name, handle) in running {
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                tracing::warn!(task = name, "still running at shutdown");
            }
        }
    }

    /// The names of the tasks started (for tests).
    #[cfg(test)]
    fn names(&self) -> Vec<&'static str> {
        self.lock().iter().map(|(n, _)| *n).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, JoinHandle<()>)>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn tasks_run_their_rounds_and_stop_at_shutdown() {
        let b = Background::default();
        let rounds = Arc::new(AtomicUsize::new(0));
        let r = rounds.clone();
        b.every(
            "test-task",
            "nothing",
            Duration::from_millis(5),
            move || {
                r.fetch_add(1, Ordering::Relaxed);
                true
            },
        );
        let gone = Arc::new(AtomicUsize::new(0));
        let g = gone.clone();
        b.every(
            "ends-itself",
            "nothing",
            Duration::from_millis(1),
            move || g.fetch_add(1, Ordering::Relaxed) < 2,
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(b.names(), ["test-task", "ends-itself"]);
        let started = Instant::now();
        b.shutdown(Duration::from_secs(5));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "stopped at once"
        );
        assert!(rounds.load(Ordering::Relaxed) >= 2);
        assert_eq!(gone.load(Ordering::Relaxed), 3);
        assert!(b.names().is_empty());
    }
}

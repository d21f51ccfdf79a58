//! A request's deadline ends its work on Postgres, not just its answer.
//!
//! Blocking work runs on a thread of the blocking pool (`Blocking::run`); past the deadline the
//! caller is answered 504, but the thread goes on with whatever statement it sent, and a caller
//! may have lifted its own `statement_timeout` (`set_config` inside a batch, a transaction or a
//! function). So every pooled session a job checks out is watched ([`watch`]): at the deadline
//! its statement is cancelled (a CancelRequest, as `pg_cancel_backend` does), and the session
//! is closed once the job lets go of it, never pooled again.
//!
//! The order keeps the cancel on the statement it was meant for: the job lets go of a session
//! only under the same lock the deadline cancels under, so a cancel is never sent to a session
//! that has moved on to another request.

use postgres::CancelToken;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use tokio_postgres_rustls::MakeRustlsConnect;

/// One job's deadline: the sessions it holds now, and whether it has passed.
#[derive(Default)]
pub(crate) struct Deadline {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    expired: bool,
    next_id: u64,
    sessions: Vec<(u64, CancelToken, MakeRustlsConnect)>,
}

thread_local! {
    /// The deadline of the job running on this thread, if it runs under one.
    static CURRENT: RefCell<Option<Arc<Deadline>>> = const { RefCell::new(None) };
}

impl Deadline {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deadline has passed: every session the job holds has its statement cancelled, and
    /// will be closed when released. Blocking (a connection to Postgres per cancel): call it
    /// off the event loop.
    pub(crate) fn expire(&self) {
        let mut state = self.lock();
        state.expired = true;
        for (_, token, tls) in &state.sessions {
            if let Err(e) = token.cancel_query(tls.clone()) {
                tracing::warn!(error = %e, "the statement of an expired request was not cancelled");
            }
        }
        // Held until here: a session cannot be released (and reused) while its cancel is sent.
        state.sessions.clear();
    }

    /// Runs `f` on this thread under this deadline.
    pub(crate) fn enter<T>(self: &Arc<Self>, f: impl FnOnce() -> T) -> T {
        let before = CURRENT.with(|c| c.replace(Some(self.clone())));
        let out = f();
        CURRENT.with(|c| *c.borrow_mut() = before);
        out
    }
}

/// A session watched by the deadline of the job that holds it.
pub(crate) struct Watched {
    deadline: Arc<Deadline>,
    id: u64,
}

impl Watched {
    /// The job lets go of the session: true if the deadline passed meanwhile (the session's
    /// statement was cancelled, and the session must be closed, not pooled).
    pub(crate) fn release(self) -> bool {
        let mut state = self.deadline.lock();
        state.sessions.retain(|(id, _, _)| *id != self.id);
        state.expired
    }
}

/// The job's deadline has passed: nothing more may start under it.
#[derive(Debug)]
pub(crate) struct Expired;

/// Watches `client` under the current job's deadline; None outside of one (the background
/// threads).
pub(crate) fn watch(
    client: &postgres::Client,
    tls: &MakeRustlsConnect,
) -> Result<Option<Watched>, Expired> {
    let Some(deadline) = CURRENT.with(|c| c.borrow().clone()) else {
        return Ok(None);
    };
    let mut state = deadline.lock();
    if state.expired {
        return Err(Expired);
    }
    state.next_id += 1;
    let id = state.next_id;
    state
        .sessions
        .push((id, client.cancel_token(), tls.clone()));
    drop(state);
    Ok(Some(Watched { deadline, id }))
}

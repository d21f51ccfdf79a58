//! Interactive transactions (`/v1/transaction/begin`, `query`, `commit`, `rollback`): a
//! transaction held open on one pooled connection across requests, under three bounds.
//!
//! - At most `limits.max_open_transactions` at once (beyond: 503), so open transactions can
//!   never take the whole pool from plain requests.
//! - Idle longer than `limits.transaction_idle_timeout_ms`, or alive longer than
//!   `limits.transaction_max_lifetime_ms`, and the reaper rolls it back, resets the session
//!   and returns the connection: an abandoned transaction never holds a connection, a row lock
//!   or a snapshot past its timeout. (Postgres's own `idle_in_transaction_session_timeout`,
//!   set on every session, is the backstop.)
//! - The id is 128 random bits: it cannot be guessed; an unknown, expired or ended one is 404.
//!
//! A transaction runs one statement at a time: while one runs, another request on the same id
//! is 409 and the reaper leaves it alone (the statement timeout bounds it).

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::store::coordination::nonces::{self, WriteNonce};
use crate::store::pools::session::rollback;
use crate::store::pools::session::RESET;
use crate::store::pools::{PgConn, Pools};
use crate::store::postgres::failure::commit_lost;
use crate::store::postgres::failure::Failure;
use crate::store::statements::class::{self, Route};
use crate::store::statements::pooled::run_prepared;
use crate::store::statements::rows::{check_columns, read_rows};
use crate::store::statements::transaction::TxPlan;
use ferry_shared::api::StatementResult;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Open {
    session: PgConn,
    /// The credential that began it: only requests signed by the same one find it.
    credential: String,
    opened: Instant,
    last_used: Instant,
    /// Read-only: no nonce row is written at its COMMIT (it could not insert one).
    read_only: bool,
    /// Run as an end user's role: its COMMIT puts the login role back for the nonce row.
    as_user: bool,
    /// Rows its statements affected, kept with its outcome.
    rows: u64,
}

enum Slot {
    Idle(Box<Open>),
    /// A statement is running on it (the credential that began it).
    Busy(String),
}

pub(crate) struct OpenTransactions {
    slots: Mutex<HashMap<String, Slot>>,
    pub max_open: usize,
    pub idle: Duration,
    pub lifetime: Duration,
}

impl OpenTransactions {
    pub(crate) fn new(max_open: usize, idle: Duration, lifetime: Duration) -> Self {
        OpenTransactions {
            slots: Mutex::new(HashMap::new()),
            max_open,
            idle,
            lifetime,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks a connection out and opens the transaction on it (blocking). `table`: where its
    /// COMMIT will record its nonce (None: no outcome kept), made sure of now, since a
    /// transaction cannot create it halfway.
    pub(crate) fn begin(
        &self,
        pools: &Pools,
        plan: &TxPlan,
        credential: String,
        table: Option<&WriteNonce>,
    ) -> Result<String, ApiError> {
        // Reserve the place first, so concurrent begins cannot pass the bound.
        let id = format!("{:032x}", rand::random::<u128>());
        {
            let mut slots = self.lock();
            if slots.len() >= self.max_open {
                return Err(ApiError::Overloaded {
                    what: "open transactions (limits.max_open_transactions)",
                });
            }
            slots.insert(id.clone(), Slot::Busy(credential.clone()));
        }
        let opened = Self::open(pools, plan, table);
        match opened {
            Ok(session) => {
                let now = Instant::now();
                self.lock().insert(
                    id.clone(),
                    Slot::Idle(Box::new(Open {
                        session,
                        credential,
                        opened: now,
                        last_used: now,
                        read_only: plan.read_only,
                        as_user: plan.identity.is_some(),
                        rows: 0,
                    })),
                );
                Ok(id)
            }
            Err(e) => {
                self.lock().remove(&id);
                Err(e)
            }
        }
    }

    /// A pooled session with the transaction begun (as its user). A session found lost at the
    /// BEGIN (Postgres restarted since it was pooled) sent nothing that matters: another one is
    /// drawn, as many times as the pool has sessions.
    fn open(
        pools: &Pools,
        plan: &TxPlan,
        table: Option<&WriteNonce>,
    ) -> Result<crate::store::pools::PgConn, ApiError> {
        let mut tries = pools.pg_pooled_size();
        loop {
            let mut session = pools.pg_conn()?;
            match nonces::begin(pools, &mut session, table, &plan.begin()) {
                Err(Failure::Unsent(e)) if tries > 0 => {
                    tries -= 1;
                    tracing::debug!(error = %e, "postgres session lost before BEGIN; another one");
                    continue;
                }
                Err(f) => return Err(f.into_api()),
                Ok(()) => {}
            }
            if let Some(who) = &plan.identity {
                // A failure leaves the session in a transaction: it is closed, not pooled.
                who.assume(&mut session.client).map_err(|f| {
                    session.poisoned = true;
                    f.into_api()
                })?;
            }
            return Ok(session);
        }
    }

    /// Takes the transaction out to run on it; 404 if unknown or begun by another
    /// credential (which learns nothing of it), 409 if busy.
    fn take(&self, id: &str, credential: &str) -> Result<Box<Open>, ApiError> {
        let mut slots = self.lock();
        let slot = match slots.get_mut(id) {
            None => return Err(ApiError::TransactionNotFound),
            Some(Slot::Busy(owner)) if owner == credential => {
                return Err(ApiError::TransactionBusy)
            }
            Some(Slot::Busy(_)) => return Err(ApiError::TransactionNotFound),
            Some(Slot::Idle(open)) if open.credential != credential => {
                return Err(ApiError::TransactionNotFound)
            }
            Some(slot) => slot,
        };
        match std::mem::replace(slot, Slot::Busy(credential.to_string())) {
            Slot::Idle(open) => Ok(open),
            Slot::Busy(_) => Err(ApiError::TransactionBusy),
        }
    }

    /// Runs one statement in the transaction (blocking). A failed statement leaves the
    /// transaction open but aborted, as in Postgres: only a rollback (or the reaper) ends it.
    pub(crate) fn query(
        &self,
        id: &str,
        credential: &str,
        sql: &str,
        params: &[Value],
        limits: ReadLimits,
    ) -> Result<StatementResult, ApiError> {
        class::check(sql, Route::Write)?;
        let mut open = self.take(id, credential)?;
        // This request's deadline cancels the statement, and ends the transaction with it.
        if let Err(e) = open.session.watch_here() {
            open.session.poisoned = true;
            self.lock().remove(id);
            return Err(e);
        }
        let ran = run_prepared(&mut open.session, sql, params, check_columns, |mut rows| {
            let (kept, too_large) = read_rows(&mut rows, limits)?;
            Ok((kept, too_large, rows.rows_affected()))
        });
        let out = match ran {
            Ok((rows, None, affected)) => Ok(StatementResult {
                rows_affected: affected.unwrap_or(0),
                rows,
            }),
            Ok((_, Some(limit), _)) => {
                // The rest of the result is still on its way: the session cannot go on.
                open.session.poisoned = true;
                self.lock().remove(id);
                return Err(ApiError::ResultTooLarge { limit });
            }
            Err(f) => Err(f.into_api()),
        };
        if let Ok(r) = &out {
            open.rows = open.rows.saturating_add(r.rows_affected);
        }
        if open.session.client.is_closed() || open.session.watch_here().is_err() {
            // Past the deadline, the statement was cancelled: the transaction ends (the
            // session is closed, so Postgres rolls it back), its locks with it.
            open.session.poisoned = true;
            self.lock().remove(id);
            return out.and(Err(ApiError::Timeout {
                what: "the request",
            }));
        } else {
            open.last_used = Instant::now();
            self.lock().insert(id.to_string(), Slot::Idle(open));
        }
        out
    }

    /// Rolls back, or commits with the nonce row the commit request was signed with (as
    /// `/v1/execute` does: so a COMMIT whose connection is lost is answered by its outcome, and
    /// `/v1/outcome` can tell), then resets the session and returns it to the pool (blocking).
    /// A failed COMMIT (a serialization failure, a deferred constraint) rolled back. So did an
    /// aborted transaction's, which Postgres answers without an error: it is 409
    /// `transaction_aborted` here, never a commit. `commit`: None to roll back; Some(nonce) to
    /// commit, the nonce None where no outcome is kept (`auth.replay = "local"`).
    pub(crate) fn end(
        &self,
        pools: &Pools,
        id: &str,
        credential: &str,
        commit: Option<Option<WriteNonce>>,
    ) -> Result<(), ApiError> {
        let mut open = self.take(id, credential)?;
        self.lock().remove(id);
        open.session.watch_here()?;
        let s = &mut open.session;
        let ended = match commit {
            None => s.client.batch_execute("ROLLBACK").map_err(Failure::from),
            Some(Some(n)) if !open.read_only => {
                nonces::commit(pools, s, Some(&n), open.rows, open.as_user)
            }
            // No row to fail on: an empty statement first, which an aborted transaction
            // refuses (25P02), where its COMMIT alone would roll back silently.
            Some(_) => s.client.batch_execute("SELECT; COMMIT").map_err(|e| {
                rollback(s);
                commit_lost(e)
            }),
        };
        finish(&mut open.session);
        ended.map_err(Failure::into_api)
    }

    /// Rolls back every transaction idle or alive past its bound (blocking; the reaper thread).
    pub(crate) fn reap(&self) -> usize {
        let now = Instant::now();
        let expired: Vec<Box<Open>> = {
            let mut slots = self.lock();
            let ids: Vec<String> = slots
                .iter()
                .filter(|(_, s)| match s {
                    Slot::Idle(o) => {
                        now - o.last_used > self.idle || now - o.opened > self.lifetime
                    }
                    Slot::Busy(_) => false,
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| match slots.remove(id) {
                    Some(Slot::Idle(o)) => Some(o),
                    _ => None,
                })
                .collect()
        };
        let n = expired.len();
        for mut open in expired {
            let _ = open.session.client.batch_execute("ROLLBACK");
            finish(&mut open.session);
        }
        if n > 0 {
            tracing::info!(rolled_back = n, "abandoned transactions rolled back");
        }
        n
    }
}

/// Resets a session for the next request, or marks it to be closed.
fn finish(session: &mut PgConn) {
    if session.client.is_closed() || session.client.batch_execute(RESET).is_err() {
        session.poisoned = true;
    }
}

//! A pooled Postgres session for one request: checked out, used, and reset before anyone else
//! gets it (or closed when it cannot be).

use crate::config::NamedQuery;
use crate::store::pools::Pools;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::PgSession;

/// Puts a used session back exactly as a new one: drops every setting (back to the values given
/// at connection start), role, cursor, listener, advisory lock, temp object, prepared statement
/// and cached plan a caller may have left, whatever made them (statements are checked up front,
/// but functions such as `set_config` or `pg_advisory_lock` change the session too). One
/// statement in one round trip, about as cheap for Postgres as `SELECT 1`. It cannot run inside
/// a transaction block, and no request leaves one open (transaction control is refused up
/// front, and a function cannot open one), so should it fail the session is closed instead.
/// (The reset spelled out as ROLLBACK, BEGIN, ten statements and COMMIT cost Postgres about
/// four times as much, and its ROLLBACK wrote a warning to the server log on every request.)
///
/// The driver's types (resolved by OID) are kept across it: an OID names one type for its
/// life, and what Ferry reads of one no DDL changes (an enum is decoded as its label's text, a
/// domain by its base type). Its type-lookup statements go with it, and the driver has no way
/// to be told: the next lookup (a type no request on the session has met) finds its statement
/// gone, and the session is dropped as a lost one (`failure::driver_statement_lost`), the read
/// run again on another. Sessions learn the database's types at connect
/// (`store::postgres::user_types`), so that this is rare.
pub(crate) const RESET: &str = "DISCARD ALL";

/// Whether a session is reset after a read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Reset {
    /// After every request: raw SQL, reads as an end user, a named query that asks for it.
    #[default]
    Always,
    /// Only after a failed run: a named query that Postgres found plain
    /// (`statements::plain`), or whose operator vouches for it (`skip_reset = true`). Every
    /// other request still resets the session it used, so the session such a read gets is
    /// always a fresh one.
    OnFailure,
    /// A named query that says nothing: `OnFailure` once Postgres has found it plain, else
    /// `Always` (see [`Reset::resolve`]).
    IfPlain,
}

impl Reset {
    /// The rule: only the operator's statements may skip it (never raw SQL), never when run as
    /// an end user (whose role and claims must not outlive the request), and never when the
    /// operator asks for it (`skip_reset = false`).
    pub(crate) fn for_read(named: Option<&NamedQuery>, as_end_user: bool) -> Reset {
        match named.map(|q| q.skip_reset) {
            _ if as_end_user => Reset::Always,
            None | Some(Some(false)) => Reset::Always,
            Some(Some(true)) => Reset::OnFailure,
            Some(None) => Reset::IfPlain,
        }
    }

    /// What a read of `sql` runs with, the verdicts known so far applied: the one place
    /// `IfPlain` is decided, by both paths a read runs on.
    pub(crate) fn resolve(self, pools: &Pools, sql: &str) -> Reset {
        match self {
            Reset::IfPlain if pools.plain.plain(sql) => Reset::OnFailure,
            Reset::IfPlain => Reset::Always,
            other => other,
        }
    }

    /// Whether a run that ended with `succeeded` still needs the reset.
    pub(crate) fn needed(self, succeeded: bool) -> bool {
        self != Reset::OnFailure || !succeeded
    }
}

/// [`with_session`], again on another session when the one drawn was found lost before the
/// caller's statements were sent (`Failure::Unsent`): a write that never left is safe to send.
/// A restart of Postgres can leave every pooled session dead, so as many times as the pool has
/// sessions (each lost one is closed, not pooled again).
pub(in crate::store) fn with_sent_session<T>(
    pools: &Pools,
    mut work: impl FnMut(&mut PgSession) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mut tries = pools.pg_pooled_size();
    loop {
        match with_session(pools, &mut work) {
            Err(Failure::Unsent(e)) if tries > 0 => {
                tries -= 1;
                tracing::debug!(error = %e, "postgres session lost before the write; another one");
            }
            out => return out,
        }
    }
}

/// Runs `work` on a pooled session, then resets the session for the next request. A session
/// whose reset fails (or that `work` poisoned) is closed instead of pooled.
pub(in crate::store) fn with_session<T>(
    pools: &Pools,
    work: impl FnOnce(&mut PgSession) -> Result<T, Failure>,
) -> Result<T, Failure> {
    with_conn(pools.pg_conn(), work)
}

/// [`with_session`] for a read whose plan may spare the reset ([`Reset::OnFailure`]).
pub(in crate::store) fn with_read_session<T>(
    pools: &Pools,
    after: Reset,
    work: impl FnOnce(&mut PgSession) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let keep_prepared = after == Reset::OnFailure;
    let mut session = pools.pg_conn_keeping(keep_prepared).map_err(Failure::Api)?;
    let out = work(&mut session);
    lost_if(&mut session, &out);
    if after.needed(out.is_ok()) {
        reset(&mut session);
    }
    out
}

/// A session whose work found it lost is closed, not pooled: its connection may still be open
/// (the driver's own statement gone, `failure::driver_statement_lost`).
fn lost_if<T>(session: &mut PgSession, out: &Result<T, Failure>) {
    if matches!(out, Err(Failure::Closed(_))) {
        session.poisoned = true;
    }
}

/// [`with_session`] as Ferry's own role (`postgres.owner_url`): its bookkeeping only.
pub(in crate::store) fn with_owner_session<T>(
    pools: &Pools,
    work: impl FnOnce(&mut PgSession) -> Result<T, Failure>,
) -> Result<T, Failure> {
    with_conn(pools.owner_conn(), work)
}

/// [`with_owner_session`] for a read of Ferry's own that leaves nothing on the session (a
/// catalog lookup): reset only when it failed, as `check_schema`'s read. A reset after each,
/// once a second, was a `DISCARD ALL` a second on an idle sidecar.
pub(in crate::store) fn with_owner_read<T>(
    pools: &Pools,
    work: impl FnOnce(&mut PgSession) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mut session = pools.owner_conn().map_err(Failure::Api)?;
    let out = work(&mut session);
    lost_if(&mut session, &out);
    if out.is_err() {
        reset(&mut session);
    }
    out
}

/// [`with_session`] on a session already checked out (a replica's).
pub(in crate::store) fn with_conn<T>(
    conn: Result<crate::store::pools::PgConn, crate::error::ApiError>,
    work: impl FnOnce(&mut PgSession) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mut session = conn.map_err(Failure::Api)?;
    let out = work(&mut session);
    lost_if(&mut session, &out);
    reset(&mut session);
    out
}

fn reset(s: &mut PgSession) {
    // DISCARD ALL deallocates every prepared statement.
    s.prepared.clear();
    if s.poisoned || s.client.is_closed() {
        s.poisoned = true;
        return;
    }
    if let Err(e) = s.client.batch_execute(RESET) {
        tracing::warn!(error = %e, "postgres session reset failed; closing the connection");
        s.poisoned = true;
    }
}

/// Ends a failed transaction so the session can be reset; a session that cannot is closed.
pub(in crate::store) fn rollback(s: &mut PgSession) {
    if s.client.is_closed() || s.client.batch_execute("ROLLBACK").is_err() {
        s.poisoned = true;
    }
}

//! Running the caller's statements on Postgres (blocking; called inside `Blocking::run`).

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::store::coordination::nonces::{self, WriteNonce};
use crate::store::pools::session::{rollback, with_read_session, with_sent_session, Reset, RESET};
use crate::store::pools::Pools;
use crate::store::postgres::failure::commit_lost;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::postgres::param_types::{self, ParamTypes};
use crate::store::postgres::{ask, PgSession};
use crate::store::statements::class::{self, Route};
use crate::store::statements::params::TextParam;
use crate::store::statements::read::{self, Steps, Taken};
use crate::store::statements::rows::{bind, read_rows, refs};
use ferry_shared::api::Row;
use postgres::fallible_iterator::FallibleIterator;
use postgres::{RowIter, Statement};
use postgres_types::Type;
use serde_json::Value;

/// Runs a read and returns its rows as JSON objects. It runs in a read-only transaction (the
/// session default), so a write sent as a read is refused by Postgres and changes nothing.
///
/// A read is idempotent, so when the pooled connection turns out to be dead (Postgres restarted
/// or ended the session since it was opened) it is run again on another: as many times as the
/// pool holds sessions that can all be dead (each one found dead is closed, not pooled again).
pub(crate) fn query(
    pools: &Pools,
    sql: &str,
    params: &[Value],
    limits: ReadLimits,
    who: Option<&SessionIdentity>,
    after: Reset,
) -> Result<Vec<Row>, ApiError> {
    class::check(sql, Route::Read)?;
    let after = after.resolve(pools, sql);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match with_read_session(pools, after, |s| {
            query_on(s, &pools.param_types, (sql, params), limits, after, who)
        }) {
            Err(Failure::Closed(e)) if attempts <= pools.pg_pooled_size() => {
                tracing::debug!(error = %e, "postgres session was lost; on another");
                continue;
            }
            Err(f) => return Err(f.into_api()),
            Ok(rows) => return Ok(rows),
        }
    }
}

/// A plain read on a replica's session, as [`query`] does it. Not retried here: the caller
/// sends it to the primary instead.
pub(crate) fn query_replica(
    pools: &Pools,
    replica: &crate::store::replicas::Replica,
    wait: std::time::Duration,
    sql: &str,
    params: &[Value],
    limits: ReadLimits,
    who: Option<&SessionIdentity>,
) -> Result<Vec<Row>, ApiError> {
    class::check(sql, Route::Read)?;
    crate::store::pools::session::with_conn(replica.get(wait), |s| {
        query_on(
            s,
            &pools.param_types,
            (sql, params),
            limits,
            Reset::Always,
            who,
        )
    })
    .map_err(Failure::into_api)
}

/// Runs a write and returns the number of rows it affected; it is committed when this
/// returns. Never retried: a dead connection may have sent the statement, and only the caller
/// knows if running it twice is safe.
pub(crate) fn execute(
    pools: &Pools,
    sql: &str,
    params: &[Value],
    who: Option<&SessionIdentity>,
    nonce: Option<&WriteNonce>,
) -> Result<u64, ApiError> {
    class::check(sql, Route::Write)?;
    with_sent_session(pools, |s| {
        if nonce.is_none() {
            // This one statement's implicit transaction may write; the reset turns it back.
            nonces::record_then(pools, s, None, "SET default_transaction_read_only = off")?;
        } else {
            // A transaction of its own, so the nonce's row commits exactly when it does.
            nonces::begin(pools, s, nonce, "BEGIN READ WRITE")?;
        }
        // Whether the statement went out: without a nonce it commits on its own, so a
        // connection lost after that leaves it unknown.
        let mut sent = false;
        let ran = (|| {
            if let Some(who) = who {
                who.assume(&mut s.client)?;
            }
            sent = true;
            // Should the remembered parameter types turn out stale, the failed try aborted the
            // write's transaction: it is begun again (as the same user) before the retry.
            let mut restart = |s: &mut PgSession| -> Result<(), Failure> {
                s.client
                    .batch_execute("ROLLBACK; BEGIN READ WRITE")
                    .map_err(Failure::from)?;
                match who {
                    Some(who) => who.assume(&mut s.client),
                    None => Ok(()),
                }
            };
            run(
                s,
                &pools.param_types,
                sql,
                params,
                |_| Ok(()),
                |mut rows| {
                    while rows.next()?.is_some() {}
                    Ok(rows.rows_affected().unwrap_or(0))
                },
                nonce.is_some().then_some(&mut restart as _),
            )
        })();
        match (ran, nonce) {
            (Ok(rows), Some(_)) => {
                nonces::commit(pools, s, nonce, rows, who.is_some()).map(|()| rows)
            }
            (Err(f), Some(_)) => {
                rollback(s);
                nonces::refuse_replays(s, nonce);
                Err(f)
            }
            (Err(Failure::Closed(e)), None) if sent => Err(commit_lost(e)),
            (out, None) => out,
        }
    })
    .map_err(Failure::into_api)
}

/// Postgres ping for /readyz.
pub(crate) fn ping(pools: &Pools) -> Result<(), ApiError> {
    let mut conn = pools.pg_conn()?;
    conn.client
        .simple_query("SELECT 1")
        .map(|_| ())
        .map_err(|e| Failure::from(e).into_api())
}

/// The settings that the login role and the database carry (`ALTER ROLE ... SET`, `ALTER
/// DATABASE ... SET`), as `name=value`, in one round trip on a pooled session. Sessions pin
/// the ones Ferry depends on (`postgres::PINNED`); the probe reports them all.
pub(crate) fn role_settings(pools: &Pools) -> Result<Vec<String>, ApiError> {
    let mut conn = pools.pg_conn()?;
    let answer = conn
        .client
        .simple_query(
            "SELECT c FROM pg_db_role_setting s, unnest(s.setconfig) c \
             WHERE s.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user)) \
               AND s.setdatabase IN \
                   (0, (SELECT oid FROM pg_database WHERE datname = current_database())) \
             ORDER BY c",
        )
        .map_err(|e| Failure::from(e).into_api())?;
    Ok(answer
        .iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect())
}

fn query_on(
    session: &mut PgSession,
    types: &ParamTypes,
    (sql, params): (&str, &[Value]),
    limits: ReadLimits,
    after: Reset,
    who: Option<&SessionIdentity>,
) -> Result<Vec<Row>, Failure> {
    let PgSession {
        client, prepared, ..
    } = session;
    let mut steps = OnPool(client);
    let read = async {
        match after {
            Reset::OnFailure if who.is_none() => {
                read::kept(&mut steps, prepared, sql, params, limits).await
            }
            _ => read::read(&mut steps, types, (sql, params), limits, who).await,
        }
    };
    let (rows, too_large) = ask::blocking(read).unwrap_or_else(|| {
        Err(Failure::Api(ApiError::internal(
            "a blocking read did not answer at once",
        )))
    })?;
    if let Some(limit) = too_large {
        // The rest of the result is still on its way: close the connection rather than
        // read and discard it.
        session.poisoned = true;
        return Err(Failure::Api(ApiError::ResultTooLarge { limit }));
    }
    Ok(rows)
}

/// A read's steps on a pooled session's blocking driver: each answers at once.
struct OnPool<'a>(&'a mut postgres::Client);

impl Steps for OnPool<'_> {
    async fn typed(
        &mut self,
        sql: &str,
        params: &[TextParam],
        types: &[Type],
        limits: ReadLimits,
    ) -> Result<Taken, Failure> {
        let typed = read::typed(params, types);
        read_rows(&mut self.0.query_typed_raw(sql, typed)?, limits)
    }
    async fn prepare(&mut self, sql: &str) -> Result<Statement, Failure> {
        Ok(self.0.prepare(sql)?)
    }
    async fn run(
        &mut self,
        stmt: &Statement,
        params: &[TextParam],
        limits: ReadLimits,
    ) -> Result<Taken, Failure> {
        read_rows(&mut self.0.query_raw(stmt, refs(params))?, limits)
    }
    async fn reset(&mut self) -> Result<(), Failure> {
        Ok(self.0.batch_execute(RESET)?)
    }
    async fn assume(&mut self, who: &SessionIdentity) -> Result<(), Failure> {
        who.assume(self.0)
    }
}

/// Readies the session for the retry after a failed try: begins a write's aborted transaction
/// again, or resets a read's session that is not reset after it.
type Restart<'a> = &'a mut dyn FnMut(&mut PgSession) -> Result<(), Failure>;

/// Runs `sql` and hands its rows to `take`. With the parameter types remembered from an earlier
/// run it costs one round trip; otherwise the statement is prepared first (a second round
/// trip), `check`ed, and its types remembered. A remembered type that has gone stale fails the
/// fast run with a 22/42 error (which committed nothing): the statement is then run the slow
/// way, as if it were new, after `restart` readies the session for it.
fn run<T>(
    session: &mut PgSession,
    types: &ParamTypes,
    sql: &str,
    params: &[Value],
    check: impl Fn(&Statement) -> Result<(), Failure>,
    mut take: impl FnMut(RowIter<'_>) -> Result<T, Failure>,
    restart: Option<Restart<'_>>,
) -> Result<T, Failure> {
    if let Some(known) = types.get(sql) {
        let conn = &mut session.client;
        // A value that does not fit a remembered type may fit the current one.
        if let Ok(bound) = bind(&known, params) {
            let typed = read::typed(&bound, &known);
            let failed = match conn.query_typed_raw(sql, typed).map_err(Failure::from) {
                Ok(rows) => match take(rows) {
                    Err(Failure::Pg(e)) if param_types::maybe_stale(&e) => true,
                    other => return other,
                },
                Err(Failure::Pg(e)) if param_types::maybe_stale(&e) => true,
                Err(other) => return Err(other),
            };
            // Inside a transaction the failure aborted it: start it over first.
            if let (true, Some(restart)) = (failed, restart) {
                restart(session)?;
            }
        }
        types.forget(sql);
    }
    let conn = &mut session.client;
    let stmt = conn.prepare(sql)?;
    check(&stmt)?;
    let bound = bind(stmt.params(), params).map_err(Failure::Api)?;
    types.remember(sql, stmt.params());
    take(conn.query_raw(&stmt, refs(&bound))?)
}

/// A statement described, then run (two round trips), without remembered types: inside a
/// transaction the fast path cannot fall back, since a failed statement aborts the transaction.
pub(in crate::store) fn run_prepared<T>(
    session: &mut PgSession,
    sql: &str,
    params: &[Value],
    check: impl Fn(&Statement) -> Result<(), Failure>,
    take: impl FnOnce(RowIter<'_>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let conn = &mut session.client;
    let stmt = conn.prepare(sql)?;
    check(&stmt)?;
    let bound = bind(stmt.params(), params).map_err(Failure::Api)?;
    take(conn.query_raw(&stmt, refs(&bound))?)
}

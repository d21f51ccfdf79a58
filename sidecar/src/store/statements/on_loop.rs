//! Plain reads on the event loop (`pg_async` sessions): the same statement check, parameter
//! binding (`rows`), one-round-trip statements, read limits and reset as `pooled::query`, without the hop to
//! the blocking pool, and the reset finished after the answer is on its way. Returns None when
//! this worker has no session free; the caller then takes the pooled path.

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::store::pools::session::Reset;
use crate::store::pools::session::RESET;
use crate::store::pools::Pools;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::postgres::loop_session::{AsyncSession, Prepared};
use crate::store::postgres::param_types::{self, ParamTypes};
use crate::store::statements::behind::{sent_behind, Sent};
use crate::store::statements::class::{self, Route};
use crate::store::statements::rows::{self, RowBudget};
use ferry_shared::api::Row;
use futures_util::StreamExt;
use postgres_types::ToSql;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio_postgres::{Client, RowStream};

pub(crate) async fn query(
    pools: Arc<Pools>,
    sql: String,
    params: Vec<Value>,
    limits: ReadLimits,
    who: Option<Arc<SessionIdentity>>,
    after: Reset,
) -> Option<Result<Vec<Row>, ApiError>> {
    if let Err(e) = class::check(&sql, Route::Read) {
        return Some(Err(e));
    }
    let after = after.resolve(&pools, &sql);
    // The session's work runs in a task of its own on this worker: the answer is sent back as
    // soon as the rows are in, and the task goes on to finish the reset (whose answer comes
    // after the rows) before the session is reused. A caller that gives up early (its
    // deadline) ends the statement too: the task sees the answer's receiver dropped.
    let (tx, rx) = oneshot::channel();
    let read = Read {
        sql,
        params,
        limits,
        who,
        after,
    };
    actix_rt::spawn(read_task(pools, read, tx));
    // A task that ended without answering had no session: the pooled path runs the read.
    rx.await.ok().flatten()
}

type Answer = Option<Result<Vec<Row>, ApiError>>;

/// What one read runs, and whether its session is reset after it.
struct Read {
    sql: String,
    params: Vec<Value>,
    limits: ReadLimits,
    who: Option<Arc<SessionIdentity>>,
    after: Reset,
}

async fn read_task(pools: Arc<Pools>, read: Read, mut tx: oneshot::Sender<Answer>) {
    let Read {
        sql,
        params,
        limits,
        who,
        after,
    } = read;
    // A read is idempotent: on a session found lost (Postgres restarted or ended it since it
    // was opened) it is run again on another, as often as this worker's share can hold lost
    // ones (each is closed, not reused).
    let tries = pools.pg_share() + 1;
    for attempt in 1..=tries {
        let keep_prepared = after == Reset::OnFailure;
        let mut session = match pools.pg_session(keep_prepared).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                let _ = tx.send(Some(Err(e)));
                return;
            }
        };
        let reset_ok = {
            let AsyncSession {
                client, prepared, ..
            } = &mut session;
            let Some(client) = client.as_ref() else {
                return;
            };
            // Only the operator's `skip_reset` statements find theirs prepared (for anything else
            // the checkout closed them).
            let mut cache = keep_prepared.then_some(prepared);
            let work = async {
                match &who {
                    Some(who) => match who.assume_async(client).await {
                        Ok(()) => {
                            let types = &pools.param_types;
                            read_on(client, types, &sql, &params, limits, after, None).await
                        }
                        Err(f) => (Err(f), None),
                    },
                    None => {
                        let c = cache.as_deref_mut();
                        read_on(client, &pools.param_types, &sql, &params, limits, after, c).await
                    }
                }
            };
            // The caller gone (its deadline passed): the session is dropped mid-work, which
            // cancels the statement and holds the slot until its backend is gone.
            let (out, reset) = tokio::select! {
                out = work => out,
                () = tx.closed() => return,
            };
            // The rest of the result still on its way, or the connection gone: the session is
            // dropped (closing the connection), not reset.
            let abandoned = matches!(out, Ok((_, Some(_))) | Err(Failure::Closed(_)));
            let succeeded = matches!(out, Ok((_, None)));
            match out {
                Err(Failure::Closed(e)) if attempt < tries => {
                    tracing::debug!(error = %e, "postgres session was lost; on another");
                    continue;
                }
                Ok((rows, None)) => {
                    let _ = tx.send(Some(Ok(rows)));
                }
                Ok((_, Some(limit))) => {
                    let _ = tx.send(Some(Err(ApiError::ResultTooLarge { limit })));
                }
                Err(f) => {
                    let _ = tx.send(Some(Err(f.into_api())));
                }
            }
            if abandoned {
                return;
            }
            if reset.is_none() && !after.needed(succeeded) {
                // Nothing to undo (`skip_reset`): the session goes back as it came, with the
                // statement prepared on it.
                true
            } else {
                // DISCARD ALL deallocates every prepared statement.
                if let Some(cache) = cache {
                    cache.clear();
                }
                reset_session(client, reset).await
            }
        };
        session.reusable = reset_ok;
        return;
    }
}

/// A `skip_reset` statement (no reset follows a successful run) as a statement prepared on the
/// session: Bind and Execute only, once it is there. One that Postgres refuses as prepared
/// (a 22/42 error, as for remembered types, or a plan whose result changed: 0A000, after a
/// schema change) is run again the slow way on a reset session, once; the caller resets after
/// any failed run.
async fn run_prepared(
    client: &Client,
    prepared: &mut Prepared,
    sql: &str,
    params: &[Value],
    limits: ReadLimits,
) -> Result<(Vec<Row>, Option<String>), Failure> {
    if let Some(stmt) = prepared.get(sql) {
        let bound = rows::bind(stmt.params(), params).map_err(Failure::Api)?;
        match collect(client.query_raw(stmt, rows::refs(&bound)).await, limits).await {
            Err(Failure::Pg(e)) if param_types::stale_prepared(&e) => {
                // A failed run all the same: what it left on the session goes first (and with
                // it every statement prepared there).
                prepared.clear();
                if !reset_session(client, None).await {
                    return Err(Failure::Pg(e));
                }
            }
            other => return other,
        }
    }
    let stmt = client.prepare(sql).await?;
    rows::check_columns(&stmt)?;
    let bound = rows::bind(stmt.params(), params).map_err(Failure::Api)?;
    let out = collect(client.query_raw(&stmt, rows::refs(&bound)).await, limits).await;
    if out.is_ok() {
        prepared.insert(sql.into(), stmt);
    }
    out
}

/// Finishes the reset sent behind the statement, or sends it now.
async fn reset_session(client: &Client, sent: Option<Sent<'_>>) -> bool {
    match sent {
        Some(sent) => sent.finish().await.is_ok(),
        None => client.batch_execute(RESET).await.is_ok(),
    }
}

/// `pooled::run` for the async driver: with remembered parameter types one round trip, with the
/// session's reset sent right behind the statement (both written before either answer is
/// read); else prepare (checked, types remembered) and run, and the caller resets after. A
/// stale remembered type falls back to the slow way, on a session reset first.
async fn read_on<'a>(
    client: &'a Client,
    types: &ParamTypes,
    sql: &str,
    params: &[Value],
    limits: ReadLimits,
    after: Reset,
    prepared: Option<&mut Prepared>,
) -> (
    Result<(Vec<Row>, Option<String>), Failure>,
    Option<Sent<'a>>,
) {
    if let Some(prepared) = prepared {
        return (
            run_prepared(client, prepared, sql, params, limits).await,
            None,
        );
    }
    if let Some(known) = types.get(sql) {
        if let Ok(bound) = rows::bind(&known, params) {
            let typed = bound
                .iter()
                .zip(known.iter())
                .map(|(p, ty)| (p as &(dyn ToSql + Sync), ty.clone()));
            let read = async { collect(client.query_typed_raw(sql, typed).await, limits).await };
            let (out, reset) = if after == Reset::Always {
                let (out, reset) = sent_behind(read, Box::pin(client.batch_execute(RESET))).await;
                (out, Some(reset))
            } else {
                // Sent only if the read fails (the caller then resets).
                (read.await, None)
            };
            match out {
                // A reset sent behind the attempt ran before anything sent from here on.
                Err(Failure::Pg(e)) if param_types::maybe_stale(&e) => {
                    // Else the failed attempt is a failed run, whatever the retry does: what it
                    // left on the session goes first.
                    if reset.is_none() && !reset_session(client, None).await {
                        return (Err(Failure::Pg(e)), None);
                    }
                }
                other => return (other, reset),
            }
        }
        types.forget(sql);
    }
    let slow = async {
        let stmt = client.prepare(sql).await?;
        rows::check_columns(&stmt)?;
        let bound = rows::bind(stmt.params(), params).map_err(Failure::Api)?;
        types.remember(sql, stmt.params());
        collect(client.query_raw(&stmt, rows::refs(&bound)).await, limits).await
    };
    (slow.await, None)
}

/// Decodes rows as they arrive, within the read limits (see `rows::read_rows`).
async fn collect(
    rows: Result<RowStream, tokio_postgres::Error>,
    limits: ReadLimits,
) -> Result<(Vec<Row>, Option<String>), Failure> {
    let mut rows = std::pin::pin!(rows?);
    let mut budget = RowBudget::new(limits);
    while let Some(row) = rows.next().await.transpose()? {
        if let Some(limit) = budget.push(&row)? {
            return Ok((budget.rows, Some(limit)));
        }
    }
    Ok((budget.rows, None))
}

//! Plain reads on the event loop (`pg_async` sessions): the same statement check, parameter
//! binding (`rows`), one-round-trip statements, read limits and reset as `pooled::query`, without the hop to
//! the blocking pool, and the reset finished after the answer is on its way. Returns None when
//! this worker has no session free; the caller then takes the pooled path.

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::store::pools::session::{Reset, RESET};
use crate::store::pools::Pools;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::postgres::loop_session::AsyncSession;
use crate::store::statements::behind::{sent_behind, Sent};
use crate::store::statements::class::{self, Route};
use crate::store::statements::params::TextParam;
use crate::store::statements::read::{self, Steps, Taken};
use crate::store::statements::rows::{self, RowBudget};
use ferry_shared::api::Row;
use futures_util::StreamExt;
use postgres_types::Type;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio_postgres::{Client, RowStream, Statement};

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
        // A caller gone (its deadline) leaves the line: its place goes to the next read.
        let session = tokio::select! {
            s = pools.pg_session(keep_prepared) => s,
            _ = tx.closed() => return,
        };
        let mut session = match session {
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
            // The reset goes right behind a statement sent with remembered types.
            let mut steps = OnLoop {
                client,
                behind: after == Reset::Always,
                sent: None,
            };
            let work = async {
                let types = &pools.param_types;
                match cache.as_deref_mut() {
                    Some(kept) if who.is_none() => {
                        read::kept(&mut steps, kept, &sql, &params, limits).await
                    }
                    _ => {
                        read::read(&mut steps, types, (&sql, &params), limits, who.as_deref()).await
                    }
                }
            };
            // The caller gone (its deadline passed): the session is dropped mid-work, which
            // cancels the statement and holds the slot until its backend is gone.
            let out = tokio::select! {
                out = work => out,
                () = tx.closed() => return,
            };
            let reset = steps.sent.take();
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

/// Finishes the reset sent behind the statement, or sends it now.
async fn reset_session(client: &Client, sent: Option<Sent<'_>>) -> bool {
    match sent {
        Some(sent) => sent.finish().await.is_ok(),
        None => client.batch_execute(RESET).await.is_ok(),
    }
}

/// A read's steps on a worker's own session (`read`). With `behind`, the session's reset is
/// sent right behind a statement sent with remembered types (both written before either
/// answer is read: `behind::sent_behind`), and kept in `sent` for the caller to finish after
/// the answer has gone; a retry finishes it first.
struct OnLoop<'a> {
    client: &'a Client,
    behind: bool,
    sent: Option<Sent<'a>>,
}

impl<'a> Steps for OnLoop<'a> {
    async fn typed(
        &mut self,
        sql: &str,
        params: &[TextParam],
        types: &[Type],
        limits: ReadLimits,
    ) -> Result<Taken, Failure> {
        let client: &'a Client = self.client;
        let typed = read::typed(params, types);
        let read = async { collect(client.query_typed_raw(sql, typed).await, limits).await };
        if !self.behind {
            return read.await;
        }
        let (out, sent) = sent_behind(read, Box::pin(client.batch_execute(RESET))).await;
        self.sent = Some(sent);
        out
    }
    async fn prepare(&mut self, sql: &str) -> Result<Statement, Failure> {
        Ok(self.client.prepare(sql).await?)
    }
    async fn run(
        &mut self,
        stmt: &Statement,
        params: &[TextParam],
        limits: ReadLimits,
    ) -> Result<Taken, Failure> {
        collect(
            self.client.query_raw(stmt, rows::refs(params)).await,
            limits,
        )
        .await
    }
    async fn reset(&mut self) -> Result<(), Failure> {
        // A reset sent behind the failed attempt ran before anything sent from here on.
        match self.sent.take() {
            Some(sent) => Ok(sent.finish().await?),
            None => Ok(self.client.batch_execute(RESET).await?),
        }
    }
    async fn assume(&mut self, who: &SessionIdentity) -> Result<(), Failure> {
        who.assume_async(self.client).await
    }
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

//! Where a read that Postgres answers runs: a streaming replica when one may serve it
//! (`replica_read`), else this worker's own session on its event loop, else the blocking pool;
//! and reads with Postgres's text output (`/sql`).

use super::lookup::Reads as State;
use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::read::plan::{ReadFormat, ReadPlan};
use crate::store::pools::session::Reset;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::statements::text::{self, Query, SqlPlan};
use crate::store::statements::{on_loop, pooled};
use ferry_shared::api::Row;
use serde_json::Value;
use std::sync::Arc;

/// A read on the primary: this worker's own Postgres session on its event loop (no thread
/// hop), within the in-flight limit and the request deadline; else, when the worker has no
/// session for it, a pooled one through the blocking pool.
pub(super) async fn on_primary(
    state: &State,
    sql: String,
    params: Vec<Value>,
    limits: ReadLimits,
    who: Option<Arc<SessionIdentity>>,
    after: Reset,
) -> Result<Vec<Row>, ApiError> {
    let slot = state.blocking.admit()?;
    let deadline = tokio::time::Instant::now() + state.blocking.timeout();
    let fast = on_loop::query(
        state.pools.clone(),
        sql.clone(),
        params.clone(),
        limits,
        who.clone(),
        after,
    );
    let answer = tokio::time::timeout_at(deadline, fast).await;
    drop(slot);
    match answer {
        Err(_) => Err(ApiError::Timeout {
            what: "the request",
        }),
        Ok(Some(answer)) => answer,
        Ok(None) => {
            let s = state.clone();
            // Within the same deadline: the read may have waited in line first.
            state
                .blocking
                .run_until(deadline, move || {
                    pooled::query(&s.pools, &sql, &params, limits, who.as_deref(), after)
                })
                .await
        }
    }
}

pub(super) async fn run_query(state: &State, plan: ReadPlan) -> Result<Vec<Row>, ApiError> {
    let ReadPlan {
        sql,
        params,
        limits,
        format,
        identity: who,
        after,
        reset,
        ..
    } = plan;
    if let ReadFormat::Text { array_mode, role } = format {
        return text_query(state, sql, &params, array_mode, role, who, limits).await;
    }
    if state.replicas.pick(after).is_some() {
        let s = state.clone();
        let (q, p, w) = (sql.clone(), params.clone(), who.clone());
        let on_replica = state
            .blocking
            .run(move || {
                Ok(super::replica_read::run(
                    &s,
                    after,
                    &q,
                    &p,
                    limits,
                    w.as_deref(),
                ))
            })
            .await?;
        if let Some(rows) = on_replica {
            return rows;
        }
    }
    on_primary(state, sql, params, limits, who, reset).await
}

/// A read with Postgres's text output, on this worker's own session, within the in-flight
/// limit and the request deadline: the whole result object as one row.
pub(super) async fn text_query(
    state: &State,
    sql: String,
    params: &[Value],
    array_mode: bool,
    role: Option<Arc<str>>,
    identity: Option<Arc<SessionIdentity>>,
    limits: ReadLimits,
) -> Result<Vec<Row>, ApiError> {
    let _slot = state.blocking.admit()?;
    let plan = SqlPlan {
        queries: vec![Query {
            sql,
            params: params
                .iter()
                .map(|p| p.as_str().map(str::to_string))
                .collect(),
            array_mode,
        }],
        batch: false,
        isolation: None,
        read_only: true,
        deferrable: false,
        role,
        identity,
    };
    let ran = tokio::time::timeout(
        state.blocking.timeout(),
        text::run(&state.pools, &plan, limits),
    )
    .await
    .map_err(|_| ApiError::Timeout {
        what: "the request",
    })??;
    match ran {
        Value::Object(result) => Ok(vec![result]),
        _ => Err(ApiError::internal("a text read answered no result object")),
    }
}

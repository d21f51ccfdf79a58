//! `POST /v1/transaction`: statements in one transaction on one pooled session, then
//! invalidation, both before the answer.

use super::State;
use crate::http::error::ApiError;
use crate::read::plan;
use crate::store::transaction::{self, TxPlan};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{TransactionRequest, TransactionResponse};

pub async fn transaction(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let t: TransactionRequest = super::signed_json(&state, &req, payload).await?;
    // Plan: one config snapshot, every check (statement classes included) before any I/O.
    let config = state.config();
    let limits = config.limits();
    if t.statements.is_empty() {
        return Err(ApiError::invalid(
            "statements",
            "give at least one statement",
        ));
    }
    limits.transaction_statements("statements", t.statements.len())?;
    let statements = t
        .statements
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let (sql, _) = plan::statement(&config, s.sql, s.query, &format!("statements[{i}]."))?;
            Ok((sql, s.params))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    transaction::check(&statements)?;
    let (keys, tags) = plan::invalidation(&config, t.invalidate)?;
    let tx = TxPlan {
        statements,
        isolation: t.isolation,
        read_only: t.read_only,
        deferrable: t.deferrable,
        limits: limits.read,
    };
    let s = state.clone();
    let resp = state
        .blocking
        .run(move || {
            let results = transaction::run(&s.pools, &tx)?;
            // Only after the commit, as for /v1/execute (see there).
            s.flights.forget(&keys, &tags);
            let invalidation = s.cache.invalidate(&s.pools, &keys, &tags);
            Ok(TransactionResponse {
                results,
                invalidation,
            })
        })
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

//! `POST /v1/transaction`: statements in one transaction on one pooled session, then
//! invalidation, both before the answer. And the interactive form (`/v1/transaction/begin`,
//! `query`, `commit`, `rollback`), bounded by `store::statements::interactive`.

use super::State;
use crate::config::{Config, ReadLimits};
use crate::error::ApiError;
use crate::read::identity::identity;
use crate::read::{invalidation, plan};
use crate::store::postgres::identity::SessionIdentity;
use crate::store::statements::transaction::{self, TxPlan};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{
    BeginRequest, BeginResponse, EndRequest, EndResponse, Identity, InTransactionRequest,
    TransactionRequest, TransactionResponse,
};
use std::sync::Arc;

pub(crate) async fn transaction(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (t, signer): (TransactionRequest, _) = super::signed_json_as(&state, &req, payload).await?;
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
    let raw_sql = t.statements.iter().any(|s| s.sql.is_some());
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
    let who = identity(&config, t.identity, raw_sql, "")?;
    let (keys, tags) = invalidation::plan(&config, t.invalidate)?;
    super::admit_user(&state, &config, who.as_deref()).await?;
    let tx = TxPlan {
        statements,
        isolation: t.isolation,
        read_only: t.read_only,
        deferrable: t.deferrable,
        limits: limits.read,
        identity: who,
        nonce: state.nonces.for_write(signer.nonce),
    };
    let s = state.clone();
    let resp = state
        .blocking
        .run(move || {
            let results = transaction::run(&s.pools, &tx)?;
            let done = crate::write::committed(&s, &keys, &tags);
            Ok(TransactionResponse {
                results,
                invalidation: done.invalidation,
                position: done.position,
            })
        })
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

/// The options of a transaction (no statements: those come one per request).
fn options(b: BeginRequest, limits: ReadLimits, who: Option<Arc<SessionIdentity>>) -> TxPlan {
    TxPlan {
        statements: Vec::new(),
        isolation: b.isolation,
        read_only: b.read_only,
        deferrable: b.deferrable,
        limits,
        identity: who,
        // An interactive transaction lives on the sidecar that began it: its later requests
        // name its id, which no other sidecar knows, and that sidecar's own store refuses
        // their replays.
        nonce: None,
    }
}

/// Who may use an interactive transaction: the credential that signed the request and, when
/// it was begun as an end user, that user. Any other pair finds no such transaction.
fn owner(
    config: &Config,
    credential: String,
    asked: Option<Identity>,
    raw_sql: bool,
) -> Result<(String, Option<Arc<SessionIdentity>>), ApiError> {
    let who = identity(config, asked, raw_sql, "")?;
    let owner = match &who {
        Some(w) => format!("{credential}\nuser:{}", w.user),
        None => credential,
    };
    Ok((owner, who))
}

/// `POST /v1/transaction/begin`: an interactive transaction on one pooled connection.
pub(crate) async fn begin(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (b, signer): (BeginRequest, _) = super::signed_json_as(&state, &req, payload).await?;
    let credential = signer.credential;
    let config = state.config();
    let (owner, who) = owner(&config, credential, b.identity.clone(), false)?;
    super::admit_user(&state, &config, who.as_deref()).await?;
    let plan = options(b, config.limits().read, who);
    // Only where its commit will write a row (`store::statements::interactive`).
    let table = state
        .nonces
        .for_write(signer.nonce)
        .filter(|_| !plan.read_only);
    let s = state.clone();
    let id = state
        .blocking
        .run(move || s.transactions.begin(&s.pools, &plan, owner, table.as_ref()))
        .await?;
    Ok(HttpResponse::Ok().json(BeginResponse {
        id,
        idle_timeout_ms: config.transaction_idle_timeout().as_millis() as u64,
        max_lifetime_ms: config.limits.transaction_max_lifetime_ms,
    }))
}

/// `POST /v1/transaction/query`: one statement in an open transaction.
pub(crate) async fn query(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (q, signer): (InTransactionRequest, _) =
        super::signed_json_as(&state, &req, payload).await?;
    let credential = signer.credential;
    let config = state.config();
    let raw_sql = q.sql.is_some();
    let (sql, _) = plan::statement(&config, q.sql, q.query, "")?;
    let (owner, who) = owner(&config, credential, q.identity, raw_sql)?;
    super::admit_user(&state, &config, who.as_deref()).await?;
    let limits = config.limits().read;
    let s = state.clone();
    let result = state
        .blocking
        .run(move || s.transactions.query(&q.id, &owner, &sql, &q.params, limits))
        .await?;
    Ok(HttpResponse::Ok().json(result))
}

/// `POST /v1/transaction/commit`: then the invalidations, as for `/v1/execute`.
pub(crate) async fn commit(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    end(state, req, payload, true).await
}

/// `POST /v1/transaction/rollback`.
pub(crate) async fn rollback(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    end(state, req, payload, false).await
}

async fn end(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
    commit: bool,
) -> Result<HttpResponse, ApiError> {
    let (e, signer): (EndRequest, _) = super::signed_json_as(&state, &req, payload).await?;
    let credential = signer.credential;
    // The commit request's nonce, recorded with the COMMIT: its outcome.
    let commit_with = commit.then(|| state.nonces.for_write(signer.nonce));
    let config = state.config();
    let (keys, tags) = invalidation::plan(&config, e.invalidate)?;
    let (owner, _) = owner(&config, credential, e.identity, false)?;
    let s = state.clone();
    let resp = state
        .blocking
        .run(move || {
            s.transactions.end(&s.pools, &e.id, &owner, commit_with)?;
            let done = if commit {
                crate::write::committed(&s, &keys, &tags)
            } else {
                crate::write::not_committed()
            };
            Ok(EndResponse {
                committed: commit,
                invalidation: done.invalidation,
                position: done.position,
            })
        })
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

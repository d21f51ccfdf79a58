//! `POST /v1/batch` (many reads, each on its own) and `POST /v1/batch/keyed` (rows of a
//! keyspace by id).

use super::State;
use crate::error::ApiError;
use crate::read::{self, keyed, plan};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{BatchRequest, BatchResponse, BatchResult, KeyedRequest};
use futures_util::stream::{self, StreamExt};

/// Lookups in one pipeline; misses run concurrently, at most one per pooled Postgres
/// connection at a time, answered in request order.
pub async fn batch(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let mut b: BatchRequest = super::signed_json(&state, &req, payload).await?;
    // One config snapshot for the whole batch.
    let config = state.config();
    config.limits().batch("reads", b.reads.len(), "reads")?;
    // Each anonymous caller in the batch counts once for the whole batch (reads with an
    // identity count against their user instead).
    let mut callers: Vec<String> = b
        .reads
        .iter_mut()
        .filter(|r| r.identity.is_none())
        .filter_map(|r| r.caller.take())
        .collect();
    callers.sort();
    callers.dedup();
    for c in &callers {
        super::admit_anonymous(&state, &config, c).await?;
    }
    let plans: Vec<Result<plan::ReadPlan, ApiError>> = b
        .reads
        .into_iter()
        .enumerate()
        .map(|(i, r)| plan::read(&config, r, &format!("reads[{i}].")))
        .collect();
    let valid: Vec<&plan::ReadPlan> = plans.iter().filter_map(|p| p.as_ref().ok()).collect();
    // Each end user in the batch counts once for the whole batch.
    let mut users: Vec<&crate::store::postgres::identity::SessionIdentity> =
        valid.iter().filter_map(|p| p.identity.as_deref()).collect();
    users.sort_by(|a, b| a.user.cmp(&b.user));
    users.dedup_by(|a, b| a.user == b.user);
    for who in users {
        super::admit_user(&state, &config, Some(who)).await?;
    }
    let lookups = read::lookup_many(&state.reads, &valid).await?;
    let max_bytes = config.limits.max_batch_bytes;
    // Misses of one named query with a batch form: one statement for all of them.
    let prefetched = tokio::time::timeout(
        config.request_timeout(),
        read::grouped::prefetch(&state.reads, &valid, &lookups, max_bytes),
    )
    .await
    .map_err(|_| ApiError::Timeout { what: "the batch" })?;
    let mut found = lookups.into_iter().zip(prefetched);
    let jobs: Vec<_> = plans
        .into_iter()
        .map(|p| {
            let (lookup, rows) = if p.is_ok() {
                found.next().unwrap_or((None, None))
            } else {
                (None, None)
            };
            let state = state.clone();
            async move {
                match p {
                    Ok(plan) => read::answer_prefetched(&state.reads, plan, lookup, rows).await,
                    Err(e) => Err(e),
                }
            }
        })
        .collect();
    let concurrency = config.postgres.pool_size.max(1) as usize;
    // Results are counted as each read completes; past the batch's budget the remaining
    // reads are answered result_too_large and their rows dropped, never accumulated.
    let mut used = 0usize;
    let collect = stream::iter(jobs).buffered(concurrency).map(|r| match r {
        Ok(resp) => {
            used = used.saturating_add(read::approx_bytes(&resp.rows));
            if used > max_bytes {
                let e = ApiError::ResultTooLarge {
                    limit: format!("limits.max_batch_bytes ({max_bytes} bytes)"),
                };
                BatchResult::Error(e.body().error)
            } else {
                BatchResult::Ok(resp)
            }
        }
        Err(e) => BatchResult::Error(e.body().error),
    });
    // One deadline for the whole batch, not one per read.
    let results: Vec<BatchResult> =
        tokio::time::timeout(config.request_timeout(), collect.collect())
            .await
            .map_err(|_| ApiError::Timeout { what: "the batch" })?;
    Ok(HttpResponse::Ok().json(BatchResponse { results }))
}

pub async fn keyed(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let mut k: KeyedRequest = super::signed_json(&state, &req, payload).await?;
    let config = state.config();
    if let Some(c) = k.caller.take() {
        super::admit_anonymous(&state, &config, &c).await?;
    }
    let plan = keyed::plan(&config, k)?;
    let s = state.clone();
    let resp = state
        .blocking
        .run(move || keyed::run(&s.pools, &s.cache, plan))
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

//! `POST /v1/batch` (many reads, each on its own) and `POST /v1/batch/keyed` (rows of a
//! keyspace by id): both are many reads through the one engine (`read::many`).

use super::State;
use crate::error::ApiError;
use crate::read::{self, keyed, plan};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{BatchRequest, BatchResponse, BatchResult, KeyedRequest};

/// Lookups in one pipeline; misses of one named query with a batch form as one statement, the
/// rest concurrently, answered in request order.
pub(crate) async fn batch(
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
    let mut plans: Vec<Result<plan::ReadPlan, ApiError>> = b
        .reads
        .into_iter()
        .enumerate()
        .map(|(i, r)| plan::read(&config, r, &format!("reads[{i}].")))
        .collect();
    for p in plans.iter_mut() {
        if let Ok(plan) = p {
            if let Err(e) = read::inferred::resolve(&state.reads, &config, plan).await {
                *p = Err(e);
            }
        }
    }
    // Each end user in the batch counts once for the whole batch.
    let mut users: Vec<&crate::store::postgres::identity::SessionIdentity> = plans
        .iter()
        .filter_map(|p| p.as_ref().ok()?.identity.as_deref())
        .collect();
    users.sort_by(|a, b| a.user.cmp(&b.user));
    users.dedup_by(|a, b| a.user == b.user);
    for who in users {
        super::admit_user(&state, &config, Some(who)).await?;
    }
    let results = read::many::read_many(&state.reads, plans, bounds(&config))
        .await?
        .into_iter()
        .map(|r| match r {
            Ok(resp) => BatchResult::Ok(resp),
            Err(e) => BatchResult::Error(e.body().error),
        })
        .collect();
    Ok(HttpResponse::Ok().json(BatchResponse { results }))
}

/// A batch's bounds: a read per pooled Postgres connection at a time, the batch's bytes, the
/// request's deadline.
fn bounds(config: &crate::config::Config) -> read::many::Bounds {
    read::many::Bounds {
        concurrency: config.postgres.pool_size.max(1) as usize,
        max_bytes: config.limits.max_batch_bytes,
        deadline: config.request_timeout(),
    }
}

pub(crate) async fn keyed(
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
    let resp = keyed::run(&state.reads, plan, bounds(&config)).await?;
    Ok(HttpResponse::Ok().json(resp))
}

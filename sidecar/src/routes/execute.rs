//! `POST /v1/execute`: a write on Postgres, then invalidation, both before the answer.

use super::State;
use crate::error::ApiError;
use crate::{db, json};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{ExecuteRequest, ExecuteResponse};

pub async fn execute(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = state.verifier.authenticate(&req, payload).await?;
    let e: ExecuteRequest = json::parse(&body)?;
    super::check_sql(&e.sql)?;
    let keys = e.invalidate.map(|i| i.keys).unwrap_or_default();
    for (i, k) in keys.iter().enumerate() {
        if k.is_empty() || k.len() > state.config.cache.max_key_bytes {
            return Err(ApiError::invalid(
                format!("invalidate.keys[{i}]"),
                "must be 1 to cache.max_key_bytes bytes",
            ));
        }
    }
    let s = state.clone();
    let resp = state
        .blocking
        .run(move || {
            let rows_affected = db::execute(&s.pools, &e.sql, &e.params)?;
            // Only after the commit: invalidating first would let a read refill the old value.
            let invalidation = s.cache.invalidate(&s.pools, &keys);
            Ok(ExecuteResponse {
                rows_affected,
                invalidation,
            })
        })
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

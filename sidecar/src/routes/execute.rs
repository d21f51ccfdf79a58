//! `POST /v1/execute`: a write on Postgres, then invalidation, both before the answer.

use super::State;
use crate::error::ApiError;
use crate::{db, plan};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{ExecuteRequest, ExecuteResponse};

pub async fn execute(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let e: ExecuteRequest = super::signed_json(&state, &req, payload).await?;
    let (sql, _) = plan::statement(&state.config(), e.sql, e.query, "")?;
    let inv = e.invalidate.unwrap_or_default();
    let max_keys = state.config().limits.max_invalidate_keys;
    if inv.keys.len() > max_keys {
        return Err(ApiError::invalid(
            "invalidate.keys",
            format!("at most {max_keys} keys (limits.max_invalidate_keys); use a tag for more"),
        ));
    }
    for (i, k) in inv.keys.iter().enumerate() {
        if k.is_empty() || k.len() > state.config().cache.max_key_bytes {
            return Err(ApiError::invalid(
                format!("invalidate.keys[{i}]"),
                "must be 1 to cache.max_key_bytes bytes",
            ));
        }
    }
    plan::check_tags(&state.config(), "invalidate.tags", &inv.tags)?;
    let s = state.clone();
    let params = e.params;
    let resp = state
        .blocking
        .run(move || {
            let rows_affected = db::execute(&s.pools, &sql, &params)?;
            // Only after the commit: invalidating first would let a read refill the old value.
            // Flights first, so no later read joins a query that began before the write.
            s.flights.forget(&inv.keys, &inv.tags);
            let invalidation = s.cache.invalidate(&s.pools, &inv.keys, &inv.tags);
            Ok(ExecuteResponse {
                rows_affected,
                invalidation,
            })
        })
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

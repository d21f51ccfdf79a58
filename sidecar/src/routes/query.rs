//! `POST /v1/query`: a read, through the cache when the request asks for it.

use super::State;
use crate::cache::{Cache, Lookup, HASH_KEY_PREFIX};
use crate::error::ApiError;
use crate::{db, json};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{CacheStatus, QueryRequest, QueryResponse};

pub async fn query(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = state.verifier.authenticate(&req, payload).await?;
    let q: QueryRequest = json::parse(&body)?;
    super::check_sql(&q.sql)?;
    if let Some(policy) = &q.cache {
        super::check_ttl(&state, "cache.ttl_s", policy.ttl_s)?;
        if let Some(k) = &policy.key {
            check_key(&state, k)?;
        }
    }
    let s = state.clone();
    let resp = state.blocking.run(move || read(&s, q)).await?;
    Ok(HttpResponse::Ok().json(resp))
}

fn check_key(state: &crate::state::AppState, key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::invalid("cache.key", "must not be empty"));
    }
    if key.len() > state.config.cache.max_key_bytes {
        return Err(ApiError::invalid(
            "cache.key",
            format!("longer than {} bytes", state.config.cache.max_key_bytes),
        ));
    }
    if key.starts_with(HASH_KEY_PREFIX) {
        return Err(ApiError::invalid(
            "cache.key",
            format!("keys starting with {HASH_KEY_PREFIX:?} are reserved for hashed entries"),
        ));
    }
    Ok(())
}

/// Blocking: lookup, then Postgres on a miss (or with no cache), then write-back.
fn read(state: &crate::state::AppState, q: QueryRequest) -> Result<QueryResponse, ApiError> {
    let Some(policy) = q.cache else {
        return Ok(QueryResponse {
            rows: db::query(&state.pools, &q.sql, &q.params)?,
            cache: CacheStatus::Bypass,
            age_ms: 0,
            key: None,
        });
    };
    let key = Cache::logical_key(&q.sql, &q.params, policy.key.as_deref());
    match state.cache.lookup(&state.pools, &key) {
        Lookup::Hit { rows, age_ms } => Ok(QueryResponse {
            rows,
            cache: CacheStatus::Hit,
            age_ms,
            key: Some(key),
        }),
        Lookup::Miss { version } => {
            let rows = db::query(&state.pools, &q.sql, &q.params)?;
            state
                .cache
                .store(&state.pools, &key, &version, &rows, policy.ttl_s);
            Ok(QueryResponse {
                rows,
                cache: CacheStatus::Miss,
                age_ms: 0,
                key: Some(key),
            })
        }
        Lookup::Bypass => Ok(QueryResponse {
            rows: db::query(&state.pools, &q.sql, &q.params)?,
            cache: CacheStatus::Bypass,
            age_ms: 0,
            key: Some(key),
        }),
    }
}

//! `POST /sql`: Neon-compatible SQL over HTTP (`[neon]`; 404 unless on). Answers as Neon's
//! proxy shapes them: a result (or `{"results": [...]}` for a batch) with 200; Postgres's
//! refusal of the caller's SQL as 400 `{"message", "code", "detail", ...}`, which the driver
//! turns into a `NeonDbError` with those fields; Ferry's own refusals and failures with their
//! usual status, as `{"message", "code", "error": {...}}` (`code` is the SQLSTATE when there
//! is one, else Ferry's stable code). A read with `Ferry-Cache-TTL` goes through the
//! read-through engine and says how in `Ferry-Cache` (hit, miss, stale, bypass) and `Age`.

use super::State;
use crate::error::ApiError;
use crate::neon;
use crate::read::{engine, text_plan};
use crate::store::statements::text;
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::CacheStatus;
use serde_json::{json, Value};

pub(crate) async fn sql(state: State, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    if !state.config().neon.enabled {
        return crate::routes::not_found_response();
    }
    match serve(&state, &req, payload).await {
        Ok((v, None)) => {
            let mut resp = HttpResponse::Ok();
            if v.get("results").is_some() {
                // A batch's transaction options come back as the answer's headers (Neon's).
                for name in [
                    "neon-batch-isolation-level",
                    "neon-batch-read-only",
                    "neon-batch-deferrable",
                ] {
                    if let Some(value) = req.headers().get(name) {
                        if name.ends_with("level") || value == "true" {
                            resp.insert_header((name, value.clone()));
                        }
                    }
                }
            }
            resp.json(v)
        }
        Ok((v, Some((status, age_ms, reason)))) => {
            let status = match status {
                CacheStatus::Hit => "hit",
                CacheStatus::Miss => "miss",
                CacheStatus::Stale => "stale",
                CacheStatus::Bypass => "bypass",
            };
            let mut resp = HttpResponse::Ok();
            resp.insert_header(("ferry-cache", status))
                .insert_header(("age", (age_ms / 1000).to_string()));
            if let Some(why) = reason {
                // A header value is visible ASCII: a name outside it is shown as `?`.
                let why: String = why
                    .chars()
                    .map(|c| {
                        if c.is_ascii_graphic() || c == ' ' {
                            c
                        } else {
                            '?'
                        }
                    })
                    .collect();
                resp.insert_header(("ferry-cache-reason", why));
            }
            resp.json(v)
        }
        Err(ApiError::Postgres(fields)) => {
            crate::metrics::global().error("sql_error");
            HttpResponse::BadRequest().json(fields)
        }
        Err(e) => {
            let detail = e.body().error;
            let code = detail
                .pg_code
                .clone()
                .unwrap_or_else(|| detail.code.as_str().to_string());
            e.respond_with(&json!({ "message": detail.message, "code": code, "error": detail }))
        }
    }
}

/// The result, and for a cached read how it was answered (status, age in milliseconds, and
/// why it was not cached when its tables were to be inferred).
type Answer = (Value, Option<(CacheStatus, u64, Option<String>)>);

async fn serve(
    state: &State,
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<Answer, ApiError> {
    // One config snapshot; the credential before anything of the body is parsed.
    let config = state.config();
    let token = neon::authenticate(req.headers(), &config)?;
    // The driver's `authToken`: the end user the statements run as (RLS), checked here.
    let authorization = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("\u{0}"));
    // Within the request's deadline, whatever the provider's key set does.
    let user = tokio::time::timeout(
        config.request_timeout(),
        state.end_users.identity(authorization, &config),
    )
    .await
    .map_err(|_| ApiError::Timeout {
        what: "the end user's signing keys",
    })??;
    let body = state.verifier.read_body(req, payload).await?;
    let request = neon::plan(req.headers(), &body, &config, &token, user)?;
    // An end user's requests count against their rate (identity.rate_per_s), as on /v1.
    super::admit_user(state, &config, request.plan.identity.as_deref()).await?;
    let limits = config.limits().read;
    if let Some((ttl_s, tables)) = request.cache {
        let Some(q) = request.plan.queries.into_iter().next() else {
            return Err(ApiError::internal("a cached read without its query"));
        };
        let role = request.plan.role.as_deref();
        let who = request.plan.identity.clone();
        let mut read = text_plan::text_read(&config, q, ttl_s, &tables, role, who)?;
        crate::read::inferred::resolve(&state.reads, &config, &mut read).await?;
        let answer = engine::read(&state.reads, read).await?;
        let rows = answer
            .rows
            .into_parsed()
            .map_err(|e| ApiError::internal(format!("a cached /sql result is not rows: {e}")))?;
        let result = rows
            .into_iter()
            .next_back()
            .map_or(Value::Null, Value::Object);
        return Ok((
            result,
            Some((answer.cache, answer.age_ms, answer.bypass_reason)),
        ));
    }
    let _slot = state.blocking.admit()?;
    match tokio::time::timeout(
        state.blocking.timeout(),
        text::run(&state.pools, &request.plan, limits),
    )
    .await
    {
        Ok(out) => Ok((out?, None)),
        Err(_) => Err(ApiError::Timeout {
            what: "the request",
        }),
    }
}

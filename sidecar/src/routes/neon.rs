//! `POST /sql`: Neon-compatible SQL over HTTP (`[neon]`; 404 unless on). Answers as Neon's
//! proxy shapes them: a result (or `{"results": [...]}` for a batch) with 200; Postgres's
//! refusal of the caller's SQL as 400 `{"message", "code", "detail", ...}`, which the driver
//! turns into a `NeonDbError` with those fields; Ferry's own refusals and failures with their
//! usual status, as `{"message", "code", "error": {...}}` (`code` is the SQLSTATE when there
//! is one, else Ferry's stable code).

use super::State;
use crate::http::error::ApiError;
use crate::neon::run::{self, SqlError};
use crate::neon::{self as sql, SqlPlan};
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

pub async fn sql(state: State, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    if !state.config().neon.enabled {
        return crate::routes::not_found_response();
    }
    match serve(&state, &req, payload).await {
        Ok(v) => HttpResponse::Ok().json(v),
        Err(SqlError::Postgres(fields)) => {
            crate::http::metrics::global().error("sql_error");
            HttpResponse::BadRequest().json(fields)
        }
        Err(SqlError::Api(e)) => {
            let detail = e.body().error;
            let code = detail
                .pg_code
                .clone()
                .unwrap_or_else(|| detail.code.as_str().to_string());
            e.respond_with(&json!({ "message": detail.message, "code": code, "error": detail }))
        }
    }
}

async fn serve(state: &State, req: &HttpRequest, payload: web::Payload) -> Result<Value, SqlError> {
    // One config snapshot; the credential before anything of the body is parsed.
    let config = state.config();
    let token = sql::authenticate(req.headers(), &config)?;
    let body = state.verifier.read_body(req, payload).await?;
    let plan: SqlPlan = sql::plan(req.headers(), &body, &config, &token)?;
    let limits = config.limits().read;
    let _slot = state.blocking.admit()?;
    match tokio::time::timeout(
        state.blocking.timeout(),
        run::run(&state.pools, &plan, limits),
    )
    .await
    {
        Ok(out) => out,
        Err(_) => Err(ApiError::Timeout {
            what: "the request",
        }
        .into()),
    }
}

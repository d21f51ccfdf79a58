//! `POST /v1/execute`: a write on Postgres, then invalidation, both before the answer.

use super::State;
use crate::error::ApiError;
use crate::read::identity::identity;
use crate::read::{invalidation, plan};
use crate::store::statements::pooled;
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{ExecuteRequest, ExecuteResponse};

pub(crate) async fn execute(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (e, signer): (ExecuteRequest, _) = super::signed_json_as(&state, &req, payload).await?;
    // Plan: one config snapshot, every check before any I/O.
    let config = state.config();
    let (sql, named) = plan::statement(&config, e.sql, e.query, "")?;
    let who = identity(&config, e.identity, named.is_none(), "")?;
    let (keys, tags) = invalidation::plan(&config, e.invalidate)?;
    super::admit_user(&state, &config, who.as_deref()).await?;
    let s = state.clone();
    let params = e.params;
    let nonce = state.nonces.for_write(signer.nonce);
    let resp = state
        .blocking
        .run(move || {
            let rows_affected =
                pooled::execute(&s.pools, &sql, &params, who.as_deref(), nonce.as_ref())?;
            let done = crate::write::committed(&s, &keys, &tags);
            Ok(ExecuteResponse {
                rows_affected,
                invalidation: done.invalidation,
                position: done.position,
            })
        })
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

//! `POST /v1/cache`: plain cache commands (get, set, del, mget, mset, incr, expire).

use super::State;
use crate::http::error::ApiError;
use crate::store::commands;
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::CacheCommand;

pub async fn cache(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let cmd: CacheCommand = super::signed_json(&state, &req, payload).await?;
    commands::validate(&state.config().limits(), &cmd)?;
    let reply = commands::run(&state.pools, &state.cache, &state.blocking, cmd).await?;
    Ok(HttpResponse::Ok().json(reply))
}

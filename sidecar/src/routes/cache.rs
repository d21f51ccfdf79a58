//! `POST /v1/cache`: plain cache commands (get, set, del, mget, mset, incr, expire).

use super::State;
use crate::error::ApiError;
use crate::{commands, json};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::CacheCommand;

pub async fn cache(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = state.verifier.authenticate(&req, payload).await?;
    let cmd: CacheCommand = json::parse(&body)?;
    commands::validate(&state, &cmd)?;
    let s = state.clone();
    let reply = state.blocking.run(move || commands::run(&s, cmd)).await?;
    Ok(HttpResponse::Ok().json(reply))
}

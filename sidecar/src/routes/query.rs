//! `POST /v1/query`: a read, through the cache when its plan says so.

use super::State;
use crate::http::error::ApiError;
use crate::read::{self, plan};
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::QueryRequest;

pub async fn query(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let q: QueryRequest = super::signed_json(&state, &req, payload).await?;
    let config = state.config();
    let plan = plan::read(&config, q, "")?;
    super::admit_user(&state, &config, plan.identity.as_deref()).await?;
    let resp = read::read(&state.reads, plan).await?;
    Ok(HttpResponse::Ok().json(resp))
}

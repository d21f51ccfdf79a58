//! `POST /v1/outcome`: whether a write committed, for a caller that got no answer (its sidecar
//! died mid-write). The answer is final: a write that had not committed is fenced and never
//! will (`store::coordination::nonces::outcome::outcome`). A committed write's invalidations are applied (again),
//! since the sidecar that ran it may have died before it could.

use super::State;
use crate::error::ApiError;
use crate::read::invalidation;
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::{OutcomeRequest, OutcomeResponse};

pub(crate) async fn outcome(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (o, _): (OutcomeRequest, _) = super::signed_json_as(&state, &req, payload).await?;
    if !ferry_shared::sign::valid_nonce(&o.nonce) {
        return Err(ApiError::invalid(
            "nonce",
            "the x-ferry-nonce the write was signed with: 16 to 64 hex characters",
        ));
    }
    let config = state.config();
    let (keys, tags) = invalidation::plan(&config, o.invalidate)?;
    let nonce = state.nonces.for_outcome(&o.nonce).ok_or_else(|| {
        ApiError::invalid(
            "nonce",
            "outcomes are kept only with auth.replay = \"shared\" (the default)",
        )
    })?;
    let s = state.clone();
    let resp = state
        .blocking
        .run(move || {
            let rows = crate::store::coordination::nonces::outcome::outcome(&s.pools, &nonce)?;
            let done = match rows {
                Some(_) => crate::write::committed(&s, &keys, &tags),
                None => crate::write::not_committed(),
            };
            Ok(OutcomeResponse {
                committed: rows.is_some(),
                rows_affected: rows,
                invalidation: done.invalidation,
                position: done.position,
            })
        })
        .await?;
    Ok(HttpResponse::Ok().json(resp))
}

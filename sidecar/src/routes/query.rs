//! `POST /v1/query`: a read, through the cache when its plan says so.

use super::State;
use crate::error::ApiError;
use crate::read::{self, plan};
use crate::store::coordination::nonces;
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::QueryRequest;

pub(crate) async fn query(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (mut q, unshared): (QueryRequest, _) =
        super::signed_json_unshared(&state, &req, payload).await?;
    let config = state.config();
    let caller = q.caller.take();
    let mut plan = plan::read(&config, q, "")?;
    read::inferred::resolve(&state.reads, &config, &mut plan).await?;
    let lookup = if plan.identity.is_some() || caller.is_some() {
        // A user's (or an anonymous caller's) budget is spent only by requests no sidecar
        // has seen.
        unshared.check(&state).await?;
        match (&plan.identity, &caller) {
            (Some(who), _) => super::admit_user(&state, &config, Some(who)).await?,
            (None, Some(c)) => super::admit_anonymous(&state, &config, c).await?,
            (None, None) => {}
        }
        read::lookup_one(&state.reads, &plan, None).await.1
    } else {
        // The replay check rides in front of the lookup: one message to Redis for both, and a
        // replay's lookup is dropped (with the fill lease it may have taken).
        let check = unshared.prepare(&state);
        let (sent, lookup) = read::lookup_one(&state.reads, &plan, check.as_ref()).await;
        nonces::settle((&state.pools, &state.blocking), check, sent).await?;
        lookup
    };
    let resp = read::answer(&state.reads, plan, lookup?).await?;
    Ok(HttpResponse::Ok().json(resp))
}

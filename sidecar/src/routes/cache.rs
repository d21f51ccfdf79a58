//! `POST /v1/cache`: plain cache commands (get, set, del, mget, mset, incr, expire).

use super::State;
use crate::error::ApiError;
use crate::http::json_out::{self, CacheBody};
use crate::store::cache::commands;
use crate::store::coordination::nonces;
use actix_web::{web, HttpRequest, HttpResponse};
use ferry_shared::api::CacheCommand;

pub(crate) async fn cache(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (cmd, unshared): (CacheCommand, _) =
        super::signed_json_unshared(&state, &req, payload).await?;
    commands::validate(&state.config().limits(), &cmd)?;
    let reply = if matches!(cmd, CacheCommand::Get { .. } | CacheCommand::Mget { .. }) {
        // A read: the replay check rides in front of the command, one message to Redis.
        let check = unshared.prepare(&state);
        let (sent, reply) = commands::run_checked(
            &state.pools,
            &state.cache,
            &state.blocking,
            cmd,
            check.as_ref(),
        )
        .await;
        nonces::settle((&state.pools, &state.blocking), check, sent).await?;
        reply?
    } else {
        // A write: Redis's record of its nonce is all that stops a replay running it twice.
        unshared.require(&state).await?;
        commands::run(&state.pools, &state.cache, &state.blocking, cmd).await?
    };
    let mut ok = HttpResponse::Ok();
    ok.content_type("application/json");
    // Checked whole (every value is text) before the status goes: API.md.
    Ok(match json_out::cache_reply(reply) {
        CacheBody::Whole(body) => ok.body(body),
        CacheBody::Pieces(body) => ok.body(body),
    })
}

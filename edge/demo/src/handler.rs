//! What every handler shares: its context (bindings, path parameter, request id), who an
//! anonymous caller is and its budget, the API key check, and rendering an outcome (good or
//! bad) as a JSON response.

use crate::requests;
use ferry_edge::config;
use ferry_edge::ferry::Ferry;
use ferry_edge::EdgeError;
use ferry_shared::api::REQUEST_ID_HEADER;
use serde_json::Value;
use worker::{Env, Headers, Request, Response, Result};

/// What a handler gets beside the request: the Worker's bindings, the route's one path
/// parameter (`:id`, `:key`; empty for routes without one), and the request id.
pub struct Ctx {
    pub env: Env,
    param: String,
    pub(crate) rid: String,
}

impl Ctx {
    pub fn new(env: Env, param: String, rid: String) -> Ctx {
        Ctx { env, param, rid }
    }

    pub(crate) fn secret(&self, name: &str) -> Result<worker::Secret> {
        self.env.secret(name)
    }
}

/// This request's id: the caller's `x-ferry-request-id` when it is well-formed (1-64 of
/// `[A-Za-z0-9_-]`), else 16 fresh random hex characters.
pub fn request_id(req: &Request) -> String {
    let given = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .ok()
        .flatten()
        .filter(|id| ferry_shared::api::valid_request_id(id));
    given.unwrap_or_else(request_id_fallback)
}

/// A fresh id, for answers given without the request at hand.
pub fn request_id_fallback() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::getrandom(&mut bytes);
    hex::encode(bytes)
}

/// Who an anonymous request comes from: Cloudflare's `CF-Connecting-IP` (it sets it on every
/// request, overwriting the client's), or `local` where nothing sets it (wrangler dev).
pub(crate) fn caller(req: &Request) -> String {
    req.headers()
        .get("cf-connecting-ip")
        .ok()
        .flatten()
        .filter(|ip| !ip.is_empty() && ip.len() <= 64)
        .unwrap_or_else(|| "local".into())
}

/// The Worker's own first line for anonymous traffic, when it has a rate-limiting binding
/// (`ANON_LIMIT` in wrangler.toml, production): refused here before any sidecar call. The
/// sidecar's budget (`limits.anonymous_*`) holds behind it either way.
pub(crate) async fn anonymous_budget(
    ctx: &Ctx,
    caller: &str,
) -> std::result::Result<(), EdgeError> {
    let Ok(limiter) = ctx.env.rate_limiter(config::ANON_LIMIT) else {
        return Ok(());
    };
    match limiter.limit(caller.to_string()).await {
        Ok(outcome) if !outcome.success => Err(EdgeError::RateLimited { retry_after_s: 10 }),
        _ => Ok(()),
    }
}

/// A handle for an anonymous route: its caller counted, at the Worker's binding if it has one
/// and at the sidecar.
pub(crate) async fn anonymous_ferry(
    req: &Request,
    ctx: &Ctx,
) -> std::result::Result<Ferry, EdgeError> {
    let caller = caller(req);
    anonymous_budget(ctx, &caller).await?;
    Ok(Ferry::from_env(&ctx.env, &ctx.rid)?.anonymous(&caller))
}

/// Writes and the cache routes need the API key (see `access.rs`).
pub(crate) fn require_api_key(req: &Request, ctx: &Ctx) -> std::result::Result<(), EdgeError> {
    let given = req.headers().get("authorization").ok().flatten();
    let configured = ctx.secret(config::API_KEY).ok().map(|s| s.to_string());
    ferry_edge::access::require_api_key(given.as_deref(), configured.as_deref())
}

/// Renders a handler's outcome. Building a response can itself fail only if the runtime is
/// broken; that error is passed to the router, which still answers.
pub fn respond(
    request_id: &str,
    outcome: std::result::Result<(u16, Value), EdgeError>,
) -> Result<Response> {
    match outcome {
        Ok((status, body)) => {
            let headers = Headers::new();
            headers.set("content-type", "application/json")?;
            headers.set(REQUEST_ID_HEADER, request_id)?;
            Ok(Response::from_json(&body)?
                .with_status(status)
                .with_headers(headers))
        }
        Err(e) => error_response(request_id, &e),
    }
}

pub fn error_response(request_id: &str, e: &EdgeError) -> Result<Response> {
    let headers = Headers::new();
    headers.set("content-type", "application/json")?;
    headers.set(REQUEST_ID_HEADER, request_id)?;
    if let Some(ra) = e.retry_after() {
        headers.set("retry-after", &ra)?;
    }
    Ok(Response::from_json(&e.body())?
        .with_status(e.status())
        .with_headers(headers))
}

pub(crate) fn param(ctx: &Ctx) -> &str {
    &ctx.param
}

/// The `ids=1,2,3` of the request's query string.
pub(crate) fn ids_asked(req: &Request) -> std::result::Result<Vec<i32>, EdgeError> {
    let url = req.url().map_err(|_| EdgeError::bad_request("bad URL"))?;
    requests::parse_ids(url.query())
}

pub(crate) async fn body_bytes(req: &mut Request) -> std::result::Result<Vec<u8>, EdgeError> {
    req.bytes()
        .await
        .map_err(|_| EdgeError::bad_request("could not read the request body"))
}

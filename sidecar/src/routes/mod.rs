//! HTTP routes: one file per endpoint. Handlers authenticate first, then parse, then do the
//! blocking work through `Blocking::run`.

pub(crate) mod batch;
pub(crate) mod cache;
pub(crate) mod execute;
pub(crate) mod health;
pub(crate) mod neon;
pub(crate) mod outcome;
pub(crate) mod query;
pub(crate) mod transaction;
pub(crate) mod upstash;

use crate::error::ApiError;
use crate::http::auth::Signer;
use crate::state::AppState;
use actix_web::{web, HttpResponse, ResponseError};
use ferry_shared::api::paths;

pub(crate) type State = web::Data<AppState>;

/// Counts a request against its end user's rate (`identity.rate_per_s`), when it has an
/// identity and the limit is on: 429 `rate_limited` past it. Each request counts once,
/// however many reads it holds, and whether or not they hit the cache.
pub(crate) async fn admit_user(
    state: &State,
    config: &crate::config::Config,
    who: Option<&crate::store::postgres::identity::SessionIdentity>,
) -> Result<(), ApiError> {
    use crate::store::coordination::rate_limit::Rate;
    let c = &config.identity;
    let (Some(who), true) = (who, c.rate_per_s > 0) else {
        return Ok(());
    };
    let rate = Rate {
        per_s: c.rate_per_s,
        burst: c.burst,
    };
    admit(state, config, &who.user, rate).await
}

/// Counts an anonymous request (no identity; `caller` as the edge passed it) against its
/// caller's budget and the budget of all anonymous callers together (`limits.anonymous_*`):
/// 429 `rate_limited` past either. What one anonymous request may cost is bounded per request
/// by the batch limits; this bounds how many of them come.
pub(crate) async fn admit_anonymous(
    state: &State,
    config: &crate::config::Config,
    caller: &str,
) -> Result<(), ApiError> {
    use crate::store::coordination::rate_limit::Rate;
    let l = &config.limits;
    if l.anonymous_rate_per_s > 0 {
        let rate = Rate {
            per_s: l.anonymous_rate_per_s,
            burst: l.anonymous_burst,
        };
        admit(state, config, &format!("anonymous\ncaller:{caller}"), rate).await?;
    }
    if l.anonymous_total_per_s > 0 {
        let rate = Rate {
            per_s: l.anonymous_total_per_s,
            burst: l.anonymous_total_burst,
        };
        admit(state, config, "anonymous\nall", rate).await?;
    }
    Ok(())
}

/// One request against `who`'s bucket (`store::coordination::rate_limit`).
async fn admit(
    state: &State,
    config: &crate::config::Config,
    who: &str,
    rate: crate::store::coordination::rate_limit::Rate,
) -> Result<(), ApiError> {
    let stores = (&state.pools, &state.blocking);
    crate::store::coordination::rate_limit::check(stores, &config.cache.key_prefix, who, rate).await
}

/// Mounts every route, and JSON 404/405 for everything else.
pub(crate) fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource(paths::HEALTHZ)
            .route(web::get().to(health::healthz))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::READYZ)
            .route(web::get().to(health::readyz))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::QUERY)
            .route(web::post().to(query::query))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::EXECUTE)
            .route(web::post().to(execute::execute))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::TRANSACTION)
            .route(web::post().to(transaction::transaction))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::TRANSACTION_BEGIN)
            .route(web::post().to(transaction::begin))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::TRANSACTION_QUERY)
            .route(web::post().to(transaction::query))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::TRANSACTION_COMMIT)
            .route(web::post().to(transaction::commit))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::TRANSACTION_ROLLBACK)
            .route(web::post().to(transaction::rollback))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::BATCH)
            .route(web::post().to(batch::batch))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::BATCH_KEYED)
            .route(web::post().to(batch::keyed))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::OUTCOME)
            .route(web::post().to(outcome::outcome))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource(paths::CACHE)
            .route(web::post().to(cache::cache))
            .default_service(web::to(method_not_allowed)),
    )
    // Upstash-compatible Redis REST (404 unless [upstash] is on).
    .service(web::resource("/").route(web::post().to(upstash::single)))
    .service(web::resource("/pipeline").route(web::post().to(upstash::pipeline)))
    .service(web::resource("/multi-exec").route(web::post().to(upstash::multi_exec)))
    // Neon-compatible SQL over HTTP (404 unless [neon] is on).
    .service(web::resource("/sql").route(web::post().to(neon::sql)))
    .default_service(web::to(not_found));
}

pub(crate) fn not_found_response() -> HttpResponse {
    ApiError::NotFound.error_response()
}

/// What no route takes: a command in the path for the Upstash door when it is on (`/get/k`),
/// else 404. Ferry's own prefixes stay Ferry's 404s.
async fn not_found(state: State, req: actix_web::HttpRequest, body: web::Payload) -> HttpResponse {
    let ferrys = ["/v1", "/sql"]
        .iter()
        .any(|p| req.path() == *p || req.path().starts_with(&format!("{p}/")));
    if state.config().upstash.enabled && !ferrys {
        return upstash::path(state, req, body).await;
    }
    ApiError::NotFound.error_response()
}

async fn method_not_allowed() -> HttpResponse {
    ApiError::MethodNotAllowed.error_response()
}

/// Authenticates a request, checks its content type, and parses its JSON body: in that
/// order, so nothing of an unauthenticated body is ever parsed.
pub(crate) async fn signed_json<T: serde::de::DeserializeOwned>(
    state: &State,
    req: &actix_web::HttpRequest,
    payload: web::Payload,
) -> Result<T, ApiError> {
    signed_json_as(state, req, payload).await.map(|(t, _)| t)
}

/// The same, with who signed the request (`Verifier::authenticate_as`). The nonce is checked
/// against every other sidecar's (`store::coordination::nonces`) before the body is parsed.
pub(crate) async fn signed_json_as<T: serde::de::DeserializeOwned>(
    state: &State,
    req: &actix_web::HttpRequest,
    payload: web::Payload,
) -> Result<(T, Signer), ApiError> {
    let (body, signer) = state.verifier.authenticate_as(req, payload).await?;
    state
        .nonces
        .check((&state.pools, &state.blocking), signer.nonce)
        .await?;
    parse_json(req, &body).map(|t| (t, signer))
}

/// A request authenticated and refused if this sidecar saw it, whose nonce other sidecars have
/// yet to be asked about: nothing it asks for may take effect before [`Unshared::check`]. A
/// read joins that check with its Redis lookup, so both go in one write and one wake-up.
#[must_use = "the shared replay check must run before the request takes effect"]
pub(crate) struct Unshared(crate::store::coordination::nonces::seen::Seen);

impl Unshared {
    pub(crate) async fn check(self, state: &State) -> Result<(), ApiError> {
        state
            .nonces
            .check((&state.pools, &state.blocking), self.0)
            .await
    }

    /// The check for a request whose effect Redis alone guards: never skipped
    /// (`SharedNonces::require`).
    pub(crate) async fn require(self, state: &State) -> Result<(), ApiError> {
        state
            .nonces
            .require(&state.pools, &state.blocking, self.0)
            .await
    }

    /// The check, to send in front of a read's own commands; `store::coordination::nonces::settle` then
    /// takes its verdict, or runs it alone when it was not sent.
    pub(crate) fn prepare(
        self,
        state: &State,
    ) -> Option<crate::store::coordination::nonces::NonceCheck> {
        state.nonces.prepare(&self.0)
    }
}

/// [`signed_json`] for reads without effects: the shared replay check is the caller's.
pub(crate) async fn signed_json_unshared<T: serde::de::DeserializeOwned>(
    state: &State,
    req: &actix_web::HttpRequest,
    payload: web::Payload,
) -> Result<(T, Unshared), ApiError> {
    let (body, signer) = state.verifier.authenticate_as(req, payload).await?;
    parse_json(req, &body).map(|t| (t, Unshared(signer.nonce)))
}

/// The content type checked, then the body parsed.
fn parse_json<T: serde::de::DeserializeOwned>(
    req: &actix_web::HttpRequest,
    body: &[u8],
) -> Result<T, ApiError> {
    // Absent is fine (the body must still be JSON); anything but JSON is refused.
    if let Some(ct) = req.headers().get(actix_web::http::header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default();
        let essence = ct.split(';').next().unwrap_or_default().trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::UnsupportedMediaType);
        }
    }
    crate::http::json::parse(body)
}

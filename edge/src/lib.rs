//! The Ferry edge Worker: a per-request handler that reads and writes through the Ferry sidecar
//! and never opens a Redis or Postgres connection itself.
//!
//! Pure logic lives in plain modules and is tested natively: `config` (bindings), `requests`
//! (routes → sidecar requests), `client` (signing, answer mapping), `error`, `jwt` (the end
//! user's token → the identity the sidecar runs their statements as). Only the wasm32
//! build pulls in the `worker` crate: `routes` (handlers) and the `#[event(fetch)]` entry here.

// A panic kills the isolate: unwrap/expect are denied outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod access;
pub mod client;
pub mod config;
pub mod error;
pub mod ferry;
pub use ferry_shared::{jwks, jwt};
pub mod outcome;
pub mod pricing;

pub use error::EdgeError;
#[cfg(target_arch = "wasm32")]
pub use ferry::end_user;
pub use ferry::Ferry;
pub mod requests;
pub mod routing;

#[cfg(target_arch = "wasm32")]
mod routes;

#[cfg(target_arch = "wasm32")]
mod entry {
    use crate::error::EdgeError;
    use crate::routes::{self, Ctx};
    use crate::routing::{route, Route, Unmatched};
    use worker::{event, Context, Env, Request, Response, Result};

    #[event(fetch)]
    async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
        let rid = routes::request_id(&req);
        let path = match req.url() {
            Ok(url) => url.path().to_string(),
            Err(_) => String::new(),
        };
        // The runtime's own method (the `worker` crate maps unknown ones, PROPFIND say, to GET).
        let method = req.inner().method().to_ascii_uppercase();
        let matched = match route(&method, &path) {
            Ok(r) => r,
            Err(Unmatched::NotFound) => {
                return routes::error_response(
                    &rid,
                    &EdgeError::NotFound(
                        "no such route: try /items/1, /items?ids=1,2, /cache/greeting, \
                         /page?ids=1,2, /me/notes, /health"
                            .into(),
                    ),
                )
            }
            Err(Unmatched::MethodNotAllowed(allow)) => {
                let resp = routes::error_response(&rid, &EdgeError::MethodNotAllowed(allow))?;
                resp.headers().set("allow", allow)?;
                return Ok(resp);
            }
        };
        let ctx = |param: String| Ctx::new(env, param, rid.clone());
        match matched {
            Route::GetItems => routes::get_items(req, ctx(String::new())).await,
            Route::PutItems => routes::put_items(req, ctx(String::new())).await,
            Route::GetItem(id) => routes::get_item(req, ctx(id)).await,
            Route::PutItem(id) => routes::put_item(req, ctx(id)).await,
            Route::RepriceItem(id) => routes::reprice_item(req, ctx(id)).await,
            Route::GetCache(key) => routes::get_cache(req, ctx(key)).await,
            Route::PutCache(key) => routes::put_cache(req, ctx(key)).await,
            Route::GetPage => routes::get_page(req, ctx(String::new())).await,
            Route::GetMyNotes => routes::get_my_notes(req, ctx(String::new())).await,
            Route::PostMyNote => routes::post_my_note(req, ctx(String::new())).await,
            Route::Health => routes::health(req, ctx(String::new())).await,
        }
    }
}

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
pub mod jwks;
pub mod jwt;
pub mod outcome;
pub mod pricing;

pub use error::EdgeError;
#[cfg(target_arch = "wasm32")]
pub use ferry::end_user;
pub use ferry::Ferry;
pub mod requests;

#[cfg(target_arch = "wasm32")]
mod routes;

#[cfg(target_arch = "wasm32")]
mod entry {
    use crate::error::EdgeError;
    use crate::routes;
    use worker::{event, Context, Env, Request, Response, Result, Router};

    #[event(fetch)]
    async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
        let result = Router::new()
            .get_async("/items", routes::get_items)
            .put_async("/items", routes::put_items)
            .get_async("/items/:id", routes::get_item)
            .put_async("/items/:id", routes::put_item)
            .post_async("/items/:id/reprice", routes::reprice_item)
            .get_async("/cache/:key", routes::get_cache)
            .put_async("/cache/:key", routes::put_cache)
            .get_async("/page", routes::get_page)
            .get_async("/me/notes", routes::get_my_notes)
            .post_async("/me/notes", routes::post_my_note)
            .get_async("/health", routes::health)
            .or_else_any_method_async("/*path", |req, _| async move {
                routes::error_response(
                    &routes::request_id(&req),
                    &EdgeError::NotFound(
                        "no such route: try /items/1, /items?ids=1,2, /cache/greeting, /page?ids=1,2, /me/notes, /health"
                            .into(),
                    ),
                )
            })
            .run(req, env)
            .await;
        // The router's own errors (e.g. a route matched with the wrong method) become JSON too.
        match result {
            Ok(resp) => Ok(resp),
            Err(e) => {
                worker::console_error!("edge error: {e}");
                routes::error_response(
                    &routes::request_id_fallback(),
                    &EdgeError::bad_request("the request could not be handled"),
                )
            }
        }
    }
}

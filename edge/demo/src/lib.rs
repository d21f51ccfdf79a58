//! Ferry's demo Worker (the one `scripts/dev.sh` runs and `wrangler deploy` publishes): a small
//! items API on the `ferry-edge` library. `routing` matches every request (JSON errors for the
//! rest), `routes` has one handler per route (`handler` what they share), `requests` what each route asks the sidecar, and
//! `pricing` the arithmetic of `POST /items/:id/reprice`. Pure logic is tested natively; the
//! handlers and the `#[event(fetch)]` entry build for wasm32 only.

// A panic kills the isolate: unwrap/expect are denied outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// `EdgeError` is the library's one error type (the demo adds none); at most one is made per
// request, so its size costs nothing worth boxing it for.
#![allow(clippy::result_large_err)]

pub mod pricing;
pub mod requests;
pub mod routing;

#[cfg(target_arch = "wasm32")]
mod handler;
#[cfg(target_arch = "wasm32")]
mod routes;

#[cfg(target_arch = "wasm32")]
mod entry {
    use crate::handler::{error_response, request_id, Ctx};
    use crate::routes;
    use crate::routing::{route, Route, Unmatched};
    use ferry_edge::EdgeError;
    use worker::{event, Context, Env, Request, Response, Result};

    #[event(fetch)]
    async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
        let rid = request_id(&req);
        let path = match req.url() {
            Ok(url) => url.path().to_string(),
            Err(_) => String::new(),
        };
        // The runtime's own method (the `worker` crate maps unknown ones, PROPFIND say, to GET).
        let method = req.inner().method().to_ascii_uppercase();
        let matched = match route(&method, &path) {
            Ok(r) => r,
            Err(Unmatched::NotFound) => {
                return error_response(
                    &rid,
                    &EdgeError::NotFound(
                        "no such route: try /items/1, /items?ids=1,2, /cache/greeting, \
                         /page?ids=1,2, /me/notes, /health"
                            .into(),
                    ),
                )
            }
            Err(Unmatched::MethodNotAllowed(allow)) => {
                let resp = error_response(&rid, &EdgeError::MethodNotAllowed(allow))?;
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

//! The Worker of the README's "Use it from a Worker", word for word (the test command
//! builds it for wasm32, so the README cannot drift from the library). Natively it is empty:
//! the `worker` crate only builds for wasm32.
#![cfg(target_arch = "wasm32")]

use ferry_edge::{end_user, EdgeError, Ferry};
use serde::Deserialize;
use worker::*;

#[derive(Deserialize, serde::Serialize)]
struct Note {
    id: i64,
    body: String,
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let answer = async {
        // The bearer JWT: HS256 (FERRY_JWT_SECRET), or RS256/ES256 (FERRY_JWKS_URL).
        let user = end_user(&req, &env).await?;
        let ferry = Ferry::from_env(&env, "my-request")?.as_user(user);
        let notes: Vec<Note> = ferry.query("my_notes").cache(30).fetch_all().await?;
        Ok::<_, EdgeError>(notes)
    };
    match answer.await {
        Ok(notes) => Response::from_json(&notes),
        Err(e) => Ok(Response::from_json(&e.body())?.with_status(e.status())),
    }
}

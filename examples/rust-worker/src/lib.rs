//! The Worker of the README's "Use it in your Worker", word for word (the test command
//! builds it for wasm32, so the README cannot drift from the library). Natively it is empty:
//! the `worker` crate only builds for wasm32.
#![cfg(target_arch = "wasm32")]

use ferry_edge::{access, jwt, EdgeError, Ferry};
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
        let auth = req.headers().get("authorization")?;
        let key = env.secret("FERRY_JWT_SECRET").ok().map(|s| s.to_string());
        let now = Date::now().as_millis() / 1000;
        let user = access::end_user(auth.as_deref(), key.as_deref(), &jwt::Rules::default(), now)?;
        let ferry = Ferry::from_env(&env, "my-request")?.as_user(user);
        let notes: Vec<Note> = ferry.query("my_notes").cache(30).fetch_all().await?;
        Ok::<_, EdgeError>(notes)
    };
    match answer.await {
        Ok(notes) => Response::from_json(&notes),
        Err(e) => Ok(Response::from_json(&e.body())?.with_status(e.status())),
    }
}

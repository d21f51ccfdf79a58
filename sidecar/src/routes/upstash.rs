//! Upstash-compatible Redis REST (`[upstash]`): `POST /` runs one command, `POST /pipeline`
//! several in order (not atomic), `POST /multi-exec` several in one MULTI/EXEC. Answers and
//! statuses as Upstash shapes them: `{"result": ...}` / `{"error": "..."}`, an array of those
//! for pipelines, 401 for a bad token, 400 for a refused or failed single command.

use super::State;
use crate::config::UpstashToken;
use crate::store::redis::lost;
use crate::upstash::{arguments, to_json, Prepared, Refused};
use actix_web::http::header::HeaderMap;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// A counter for `upstash-sync-token`: the client sends back the last one it saw (read your
/// writes). One sidecar serves every read after a write from the same Redis, so any token
/// is good; it only has to round-trip.
static SYNC: AtomicU64 = AtomicU64::new(1);

enum Shape {
    Single,
    Pipeline,
    MultiExec,
}

pub async fn single(s: State, r: HttpRequest, p: web::Payload) -> HttpResponse {
    serve(s, r, p, Shape::Single).await
}

pub async fn pipeline(s: State, r: HttpRequest, p: web::Payload) -> HttpResponse {
    serve(s, r, p, Shape::Pipeline).await
}

pub async fn multi_exec(s: State, r: HttpRequest, p: web::Payload) -> HttpResponse {
    serve(s, r, p, Shape::MultiExec).await
}

fn error(status: u16, message: &str) -> HttpResponse {
    HttpResponse::build(
        actix_web::http::StatusCode::from_u16(status)
            .unwrap_or(actix_web::http::StatusCode::BAD_REQUEST),
    )
    .json(json!({ "error": message }))
}

/// The configured token the request's bearer matches (compared in constant time).
fn token(headers: &HeaderMap, tokens: &[UpstashToken]) -> Option<UpstashToken> {
    let bearer = headers
        .get(actix_web::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let mut found = None;
    for t in tokens {
        let same = t.token.len() == bearer.len()
            && t.token
                .bytes()
                .zip(bearer.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same && found.is_none() {
            found = Some(t.clone());
        }
    }
    found
}

async fn serve(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
    shape: Shape,
) -> HttpResponse {
    let config = state.config();
    if !config.upstash.enabled {
        return crate::routes::not_found_response();
    }
    let Some(tok) = token(req.headers(), &config.upstash.tokens) else {
        return error(401, "Unauthorized");
    };
    let body = match state.verifier.read_body(&req, payload).await {
        Ok(b) => b,
        Err(e) => return error(e.code().http_status(), &e.body().error.message),
    };
    let Ok(json): Result<Value, _> = serde_json::from_slice(&body) else {
        return error(400, "ERR the body is not JSON");
    };
    let base64 = req
        .headers()
        .get("upstash-encoding")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("base64"));
    let commands = match state.upstash_commands().await {
        Ok(c) => c,
        Err(e) => return error(503, &e),
    };
    let namespace = format!("{}u:{}", config.cache.key_prefix, tok.prefix);
    let list: Vec<&Value> = match (&shape, &json) {
        (Shape::Single, v) => vec![v],
        (_, Value::Array(items)) if !items.is_empty() => items.iter().collect(),
        _ => return error(400, "ERR give an array of commands"),
    };
    if list.len() > config.cache.max_batch {
        return error(400, "ERR too many commands in one request");
    }
    // Each command checked and put in its namespace; a refused one answers for itself.
    let mut prepared: Vec<Result<Prepared, Refused>> = list
        .iter()
        .map(|c| arguments(c).and_then(|a| commands.prepare(a, &tok, &namespace)))
        .collect();
    if state.pools.redis_cluster() {
        let atomic = matches!(shape, Shape::MultiExec);
        if let Err(why) = crate::upstash::cluster::admit(&mut prepared, atomic) {
            return error(400, &why);
        }
    }
    let answers = match shape {
        Shape::MultiExec => {
            // Atomic: refuse the whole transaction if any command is refused.
            if let Some(Err(Refused(why))) = prepared.iter().find(|p| p.is_err()) {
                return error(400, why);
            }
            run(&state, &tok, &prepared, true).await
        }
        _ => run(&state, &tok, &prepared, false).await,
    };
    let answers = match answers {
        Ok(a) => a,
        Err(e) => return error(503, &e),
    };
    let shaped: Vec<(bool, Value)> = answers
        .into_iter()
        .map(|a| match a {
            Ok(redis::Value::ServerError(e)) => (false, json!({ "error": redis_error(&e) })),
            Ok(v) => (true, json!({ "result": to_json(&v, base64) })),
            Err(Refused(why)) => (false, json!({ "error": why })),
        })
        .collect();
    let mut resp = match shape {
        Shape::Single => match shaped.into_iter().next() {
            Some((true, v)) => HttpResponse::Ok().json(v),
            Some((false, v)) => HttpResponse::BadRequest().json(v),
            None => return error(500, "ERR no answer"),
        },
        _ => HttpResponse::Ok().json(shaped.into_iter().map(|(_, v)| v).collect::<Vec<_>>()),
    };
    let sync = SYNC.fetch_add(1, Ordering::Relaxed).to_string();
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(&sync) {
        resp.headers_mut().insert(
            actix_web::http::header::HeaderName::from_static("upstash-sync-token"),
            v,
        );
    }
    resp
}

/// A Redis error as Redis words it (`ERR value is not an integer or out of range`).
fn redis_error(e: &redis::ServerError) -> String {
    match e.details() {
        Some(d) => format!("{} {d}", e.code()),
        None => e.code().to_string(),
    }
}

/// Sends the prepared commands in one pipeline (one MULTI/EXEC when `atomic`): as the token's
/// script user when one of them is a script, else on this worker's multiplexed connection
/// when it has one, else on a pooled one. Refused commands are not sent; their place in the
/// answer keeps their refusal.
async fn run(
    state: &State,
    token: &UpstashToken,
    prepared: &[Result<Prepared, Refused>],
    atomic: bool,
) -> Result<Vec<Result<redis::Value, Refused>>, String> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    if atomic {
        pipe.atomic();
    }
    for p in prepared.iter().flatten() {
        let mut cmd = redis::Cmd::new();
        for a in &p.args {
            cmd.arg(a.as_slice());
        }
        pipe.add_command(cmd);
    }
    let sent = prepared.iter().filter(|p| p.is_ok()).count();
    let scripted = prepared.iter().flatten().any(|p| p.script);
    let values: Vec<redis::Value> = if sent == 0 {
        Vec::new()
    } else if state.pools.redis_cluster() {
        match crate::upstash::cluster::run(&state.pools, prepared, atomic).await {
            Ok(Some(v)) => v,
            Ok(None) => return Err("ERR redis is unavailable".into()),
            Err(e) => {
                tracing::warn!(error = %e, "upstash: redis cluster failed");
                state.pools.drop_redis_async();
                state.pools.mark_redis_failed();
                return Err("ERR redis is unavailable".into());
            }
        }
    } else if scripted {
        let redis_config = &state.config().redis;
        let mut conn = state
            .upstash_scripts
            .get(redis_config, token)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, user = %token.script_user, "upstash: script user cannot connect");
                "ERR redis is unavailable for this token's scripts".to_string()
            })?;
        match pipe.query_async(&mut conn).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "upstash: redis failed (script user)");
                state.upstash_scripts.forget(&token.script_user);
                return Err("ERR redis is unavailable".into());
            }
        }
    } else {
        // On a connection Redis (or the network) ended, reads go again on a fresh one, as on
        // every other route; a write may have run, so it is not sent again (INCR would count
        // twice). Either way a lost connection is replaced without taking Redis for down.
        let repeatable = prepared.iter().flatten().all(|p| !p.write);
        let sent = match state.pools.redis_async().await {
            Ok(Some(mut c)) => {
                let again = || repeatable.then(|| pipe.clone());
                lost::query_async(&state.pools, &mut c, &pipe, false, again)
                    .await
                    .0
            }
            Ok(None) => {
                let pools = state.pools.clone();
                state
                    .blocking
                    .run(move || lost::query::<Vec<redis::Value>>(&pools, &pipe, repeatable))
                    .await
                    .map_err(|_| "ERR redis is unavailable".to_string())?
            }
            Err(_) => return Err("ERR redis is unavailable".into()),
        };
        match sent {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "upstash: redis failed");
                state.pools.redis_failed(&e);
                // Timeouts and lost connections are I/O errors; a refused one sent nothing.
                let maybe_sent = e.is_io_error() && !e.is_connection_refusal();
                return Err(if maybe_sent && !repeatable {
                    "ERR the connection to redis was lost: the command may have run".into()
                } else {
                    "ERR redis is unavailable".into()
                });
            }
        }
    };
    let mut values = values.into_iter();
    Ok(prepared
        .iter()
        .map(|p| match p {
            Ok(_) => Ok(values.next().unwrap_or(redis::Value::Nil)),
            Err(r) => Err(r.clone()),
        })
        .collect())
}

//! Upstash-compatible Redis REST (`[upstash]`): `POST /` runs one command, `POST /pipeline`
//! several in order (not atomic), `POST /multi-exec` several in one MULTI/EXEC. Answers and
//! statuses as Upstash shapes them: `{"result": ...}` / `{"error": "..."}`, an array of those
//! for pipelines, 401 for a bad token, 400 for a refused or failed single command. A command
//! may also come in the path (`/set/k/v`), as Upstash's docs send them.

mod run;

use super::State;
use crate::config::UpstashToken;
use crate::error::ApiError;
use crate::upstash::wire::Reply;
use crate::upstash::{arguments, to_json, Bounds, Door, Prepared, Refused};
use actix_web::http::header::HeaderMap;
use actix_web::{web, HttpRequest, HttpResponse};
use run::run;
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
    /// A command in the path (`GET /set/k/v`, `POST /set/k` with the value as the body), as
    /// Upstash's docs and curl examples send them.
    Path,
}

pub(crate) async fn single(s: State, r: HttpRequest, p: web::Payload) -> HttpResponse {
    serve(s, r, p, Shape::Single).await
}

pub(crate) async fn pipeline(s: State, r: HttpRequest, p: web::Payload) -> HttpResponse {
    serve(s, r, p, Shape::Pipeline).await
}

pub(crate) async fn multi_exec(s: State, r: HttpRequest, p: web::Payload) -> HttpResponse {
    serve(s, r, p, Shape::MultiExec).await
}

/// Any other path, when the door is on (`routes` sends here what no route of Ferry's takes).
pub(crate) async fn path(s: State, r: HttpRequest, p: web::Payload) -> HttpResponse {
    serve(s, r, p, Shape::Path).await
}

/// A path command's arguments: the path's segments, then the query's pairs, then the body.
fn path_arguments(req: &HttpRequest, body: &[u8]) -> Result<Vec<Vec<u8>>, Refused> {
    let decode = |s: &str| percent_encoding::percent_decode_str(s).collect::<Vec<u8>>();
    let mut args: Vec<Vec<u8>> = req
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode)
        .collect();
    for pair in req.query_string().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "_token" {
            continue;
        }
        args.push(decode(&k.replace('+', " ")));
        if !v.is_empty() {
            args.push(decode(&v.replace('+', " ")));
        }
    }
    if !body.is_empty() {
        args.push(body.to_vec());
    }
    if args.is_empty() {
        return Err(Refused("ERR empty command".into()));
    }
    Ok(args)
}

/// A failure of the whole request: what it is (`error`: its status, Retry-After, log line and
/// count, through the one error path) and the Redis-style message Upstash's clients read, in
/// Upstash's body shape.
struct Failed {
    error: ApiError,
    message: String,
}

impl Failed {
    /// Refused as sent: 400 with Redis's words.
    fn bad(message: impl Into<String>) -> Failed {
        let message = message.into();
        Failed {
            error: ApiError::bad_request(message.clone()),
            message,
        }
    }

    /// The door's Redis cannot be reached (503 with Retry-After); `internal` is only logged.
    fn unavailable(internal: impl std::fmt::Display) -> Failed {
        Failed {
            error: ApiError::CacheUnavailable {
                internal: internal.to_string(),
            },
            message: "ERR redis is unavailable".into(),
        }
    }

    fn respond(self) -> HttpResponse {
        self.error.respond_with(&json!({ "error": self.message }))
    }
}

/// The configured token the request's bearer matches (compared in constant time).
fn token(headers: &HeaderMap, tokens: &[UpstashToken]) -> Option<UpstashToken> {
    let header = headers.get(actix_web::http::header::AUTHORIZATION)?;
    let given = ferry_shared::token::bearer(header.to_str().ok())?;
    ferry_shared::token::find(given, tokens, |t| t.token.as_str()).cloned()
}

async fn serve(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
    shape: Shape,
) -> HttpResponse {
    if !state.config().upstash.enabled {
        return crate::routes::not_found_response();
    }
    answer(state, req, payload, shape)
        .await
        .unwrap_or_else(Failed::respond)
}

async fn answer(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
    shape: Shape,
) -> Result<HttpResponse, Failed> {
    let config = state.config();
    let tok = token(req.headers(), &config.upstash.tokens).ok_or_else(|| Failed {
        error: ApiError::Unauthorized {
            what: "upstash token",
        },
        message: "Unauthorized".into(),
    })?;
    let body = state
        .verifier
        .read_body(&req, payload)
        .await
        .map_err(|e| Failed {
            message: e.body().error.message,
            error: e,
        })?;
    let json: Value = match shape {
        Shape::Path => Value::Null,
        _ => serde_json::from_slice(&body).map_err(|_| Failed::bad("ERR the body is not JSON"))?,
    };
    let base64 = req
        .headers()
        .get("upstash-encoding")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("base64"));
    let commands = state
        .upstash_commands()
        .await
        .map_err(Failed::unavailable)?;
    let namespace = config.upstash.namespace(&config.cache.key_prefix, &tok);
    let limits = config.limits().read;
    let door = Door {
        token: &tok,
        namespace: &namespace,
        own_redis: config.upstash.own_redis(),
        bounds: Bounds {
            max_bytes: limits.max_bytes,
            max_items: limits.max_rows,
        },
    };
    let list: Vec<Result<Vec<Vec<u8>>, Refused>> = match (&shape, &json) {
        (Shape::Path, _) => vec![path_arguments(&req, &body)],
        (Shape::Single, v) => vec![arguments(v)],
        (_, Value::Array(items)) if !items.is_empty() => items.iter().map(arguments).collect(),
        _ => return Err(Failed::bad("ERR give an array of commands")),
    };
    if list.len() > config.cache.max_batch {
        return Err(Failed::bad("ERR too many commands in one request"));
    }
    // Each command checked and put in its namespace; a refused one answers for itself.
    let mut prepared: Vec<Result<Prepared, Refused>> = list
        .into_iter()
        .map(|a| a.and_then(|a| commands.prepare(a, &door)))
        .collect();
    // What the commands would make Redis allocate, together (each was checked alone).
    let allocates: usize = prepared
        .iter()
        .flatten()
        .fold(0, |sum, p| sum.saturating_add(p.allocates));
    if allocates > limits.max_bytes {
        return Err(Failed::bad(format!(
            "ERR these commands would allocate {allocates} bytes, more than \
             limits.max_read_bytes ({} bytes)",
            limits.max_bytes
        )));
    }
    let on_cluster = state.pools.redis_cluster() && !door.own_redis;
    // A keyspace walk is many commands: not inside a transaction, not across a cluster.
    let walks = prepared.iter().flatten().any(|p| p.walk.is_some());
    if walks && (on_cluster || matches!(shape, Shape::MultiExec)) {
        return Err(Failed::bad(
            "ERR DBSIZE, KEYS, RANDOMKEY, FLUSHDB and SCAN WITHTYPE inside a namespace run \
             neither inside MULTI nor on a Redis Cluster",
        ));
    }
    if on_cluster {
        let atomic = matches!(shape, Shape::MultiExec);
        crate::upstash::cluster::admit(&mut prepared, atomic).map_err(Failed::bad)?;
    }
    let atomic = matches!(shape, Shape::MultiExec);
    if atomic {
        // Atomic: refuse the whole transaction if any command is refused.
        if let Some(Err(Refused(why))) = prepared.iter().find(|p| p.is_err()) {
            return Err(Failed::bad(why.clone()));
        }
    }
    let answers = run(
        &state, &config, &tok, &namespace, &prepared, atomic, on_cluster,
    )
    .await?;
    let shaped: Vec<(bool, Value)> = answers
        .into_iter()
        .zip(&prepared)
        .map(|(a, p)| match (a, p) {
            (Ok(Reply::Error(e)), _) => (false, json!({ "error": e })),
            (Ok(v), Ok(p)) => (
                true,
                json!({ "result": to_json(&p.finish(v, &namespace), base64) }),
            ),
            (Ok(v), Err(_)) => (true, json!({ "result": to_json(&v, base64) })),
            (Err(Refused(why)), _) => (false, json!({ "error": why })),
        })
        .collect();
    let mut resp = match shape {
        Shape::Single | Shape::Path => match shaped.into_iter().next() {
            Some((true, v)) => HttpResponse::Ok().json(v),
            Some((false, v)) => HttpResponse::BadRequest().json(v),
            None => {
                return Err(Failed {
                    error: ApiError::internal("no answer to a single command"),
                    message: "ERR no answer".into(),
                })
            }
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
    Ok(resp)
}

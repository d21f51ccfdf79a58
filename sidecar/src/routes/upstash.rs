//! Upstash-compatible Redis REST (`[upstash]`): `POST /` runs one command, `POST /pipeline`
//! several in order (not atomic), `POST /multi-exec` several in one MULTI/EXEC. Answers and
//! statuses as Upstash shapes them: `{"result": ...}` / `{"error": "..."}`, an array of those
//! for pipelines, 401 for a bad token, 400 for a refused or failed single command.

use super::State;
use crate::config::UpstashToken;
use crate::upstash::conns::Fault;
use crate::upstash::wire::Reply;
use crate::upstash::{arguments, from_redis, to_json, Bounds, Door, Prepared, Refused};
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
        .map(|c| arguments(c).and_then(|a| commands.prepare(a, &door)))
        .collect();
    // What the commands would make Redis allocate, together (each was checked alone).
    let allocates: usize = prepared
        .iter()
        .flatten()
        .fold(0, |sum, p| sum.saturating_add(p.allocates));
    if allocates > limits.max_bytes {
        return error(
            400,
            &format!(
                "ERR these commands would allocate {allocates} bytes, more than \
                 limits.max_read_bytes ({} bytes)",
                limits.max_bytes
            ),
        );
    }
    let on_cluster = state.pools.redis_cluster() && !door.own_redis;
    if on_cluster {
        let atomic = matches!(shape, Shape::MultiExec);
        if let Err(why) = crate::upstash::cluster::admit(&mut prepared, atomic) {
            return error(400, &why);
        }
    }
    let atomic = matches!(shape, Shape::MultiExec);
    if atomic {
        // Atomic: refuse the whole transaction if any command is refused.
        if let Some(Err(Refused(why))) = prepared.iter().find(|p| p.is_err()) {
            return error(400, why);
        }
    }
    let answers = match run(
        &state, &config, &tok, &namespace, &prepared, atomic, on_cluster,
    )
    .await
    {
        Ok(a) => a,
        Err((status, e)) => return error(status, &e),
    };
    let shaped: Vec<(bool, Value)> = answers
        .into_iter()
        .map(|a| match a {
            Ok(Reply::Error(e)) => (false, json!({ "error": e })),
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

/// A failure of the whole request: its status and Redis-style message.
type Failed = (u16, String);

/// Sends the prepared commands (refused ones are not sent; their place in the answer keeps
/// their refusal) in one exchange on the door's own connections (`upstash::conns`), inside
/// MULTI/EXEC when `atomic`; on a Redis Cluster shared with the cache, through the cluster
/// client. Scripts run as the token's script user (its ACL checked first), or as the door's
/// URL user for a whole-database token; one still running at the deadline is ended.
async fn run(
    state: &State,
    config: &crate::config::Config,
    token: &UpstashToken,
    namespace: &str,
    prepared: &[Result<Prepared, Refused>],
    atomic: bool,
    on_cluster: bool,
) -> Result<Vec<Result<Reply, Refused>>, Failed> {
    let unavailable = || (503, "ERR redis is unavailable".to_string());
    let sent: Vec<&[Vec<u8>]> = prepared
        .iter()
        .flatten()
        .map(|p| p.args.as_slice())
        .collect();
    let replies: Vec<Reply> = if sent.is_empty() {
        Vec::new()
    } else if on_cluster {
        match crate::upstash::cluster::run(&state.pools, prepared, atomic).await {
            Ok(Some(v)) => v.iter().map(from_redis).collect(),
            Ok(None) => return Err(unavailable()),
            Err(e) => {
                tracing::warn!(error = %e, "upstash: redis cluster failed");
                return Err(unavailable());
            }
        }
    } else {
        let scripted = prepared.iter().flatten().any(|p| p.script);
        let user = if scripted && !token.script_user.is_empty() {
            if let Err(why) = state
                .upstash_acl
                .verdict(&state.upstash_conns, &token.script_user, namespace)
                .await
            {
                return Err((
                    403,
                    format!("NOPERM scripts are refused for this token: {why}"),
                ));
            }
            Some((token.script_user.as_str(), token.script_password.as_str()))
        } else {
            None
        };
        let multi = [b"MULTI".to_vec()];
        let exec = [b"EXEC".to_vec()];
        let mut list: Vec<&[Vec<u8>]> = Vec::with_capacity(sent.len() + 2);
        if atomic {
            list.push(&multi);
        }
        list.extend(&sent);
        if atomic {
            list.push(&exec);
        }
        // A script may run as long as the request; anything else gets Redis's I/O timeout.
        let deadline = if scripted {
            config.request_timeout()
        } else {
            std::time::Duration::from_millis(config.redis.io_timeout_ms)
        };
        let repeatable = prepared.iter().flatten().all(|p| !p.write);
        let budget = config.limits().read.max_bytes;
        let exchanged = state
            .upstash_conns
            .exchange(user, &list, budget, deadline, repeatable)
            .await;
        let mut replies = match exchanged {
            Ok(r) => r,
            Err(Fault::TooLarge(n)) => {
                return Err((
                    400,
                    format!("ERR the reply is larger than limits.max_read_bytes ({n} bytes)"),
                ))
            }
            Err(Fault::Unavailable(e)) => {
                tracing::warn!(error = %e, "upstash: redis is unavailable");
                return Err(unavailable());
            }
            Err(Fault::Lost(e)) => {
                tracing::warn!(error = %e, "upstash: no complete answer from redis");
                if scripted {
                    end_scripts(
                        state,
                        prepared.iter().flatten().filter(|p| p.script).count(),
                    );
                }
                return Err(if repeatable {
                    unavailable()
                } else {
                    (
                        503,
                        "ERR the connection to redis was lost: the command may have run".into(),
                    )
                });
            }
        };
        if atomic {
            // MULTI's OK and each QUEUED go; EXEC's array answers the commands.
            match replies.pop() {
                Some(Reply::Array(answers)) => answers,
                Some(Reply::Error(e)) => return Err((400, e)),
                _ => return Err((400, "EXECABORT Transaction discarded".into())),
            }
        } else {
            std::mem::take(&mut replies)
        }
    };
    let mut replies = replies.into_iter();
    Ok(prepared
        .iter()
        .map(|p| match p {
            Ok(_) => Ok(replies.next().unwrap_or(Reply::Nil)),
            Err(r) => Err(r.clone()),
        })
        .collect())
}

/// Scripts still running past the request's deadline are ended (`SCRIPT KILL`, once per script
/// the request sent, until Redis says none is running), so the door's Redis serves its other
/// callers again. Redis refuses to end one that has written (UNKILLABLE): then only its
/// operator can (RELIABILITY.md says what a script holder can still do).
fn end_scripts(state: &State, scripts: usize) {
    let s = state.clone();
    actix_web::rt::spawn(async move {
        let kill = [b"SCRIPT".to_vec(), b"KILL".to_vec()];
        for _ in 0..scripts {
            let answer = s
                .upstash_conns
                // Redis takes other clients' commands only once the script has run for its
                // busy-reply-threshold (5 s by default): wait that long for the answer.
                .exchange(
                    None,
                    &[&kill],
                    4096,
                    std::time::Duration::from_secs(10),
                    false,
                )
                .await;
            tracing::warn!(answer = ?answer.as_ref().map(|r| r.first()), "upstash: a script ran past its deadline; SCRIPT KILL sent");
            let done = match &answer {
                Ok(r) => matches!(r.first(), Some(Reply::Error(e)) if e.starts_with("NOTBUSY")),
                Err(_) => true,
            };
            if done {
                break;
            }
        }
    });
}

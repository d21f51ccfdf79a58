//! Sending a request's prepared commands to the door's Redis: in runs of one kind on its own
//! connections (scripts as the token's script user), inside MULTI/EXEC when atomic, or through
//! the cluster client; a script still running past the deadline is ended.

use super::Failed;
use crate::config::UpstashToken;
use crate::error::ApiError;
use crate::routes::State;
use crate::upstash::conns::Fault;
use crate::upstash::wire::Reply;
use crate::upstash::{from_redis, Prepared, Refused};

/// Sends the prepared commands (refused ones are not sent; their place in the answer keeps
/// their refusal) in one exchange on the door's own connections (`upstash::conns`), inside
/// MULTI/EXEC when `atomic`; on a Redis Cluster shared with the cache, through the cluster
/// client. Scripts run as the token's script user (its ACL checked first), or as the door's
/// URL user for a whole-database token; one still running at the deadline is ended.
pub(super) async fn run(
    state: &State,
    config: &crate::config::Config,
    token: &UpstashToken,
    namespace: &str,
    prepared: &[Result<Prepared, Refused>],
    atomic: bool,
    on_cluster: bool,
) -> Result<Vec<Result<Reply, Refused>>, Failed> {
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
            Ok(None) => return Err(Failed::unavailable("no cluster connection")),
            Err(e) => return Err(Failed::unavailable(format!("redis cluster: {e}"))),
        }
    } else {
        let scripted = prepared.iter().flatten().any(|p| p.script);
        let script_user = if scripted && !token.script_user.is_empty() {
            if let Err(why) = state
                .upstash_acl
                .verdict(&state.upstash_conns, &token.script_user, namespace)
                .await
            {
                return Err(Failed {
                    error: ApiError::RoleNotAllowed {
                        role: token.script_user.clone(),
                    },
                    message: format!("NOPERM scripts are refused for this token: {why}"),
                });
            }
            Some((token.script_user.as_str(), token.script_password.as_str()))
        } else {
            None
        };
        // Scripts run as the script user, the rest as the door's, and a keyspace walk on its
        // own (`upstash::scoped`): a pipeline goes in runs of one kind, in order; a
        // transaction whole.
        let budget = config.limits().read.max_bytes;
        let segments: Vec<(bool, Vec<&[Vec<u8>]>)> = if atomic {
            vec![(scripted, sent)]
        } else {
            let mut out: Vec<(bool, Vec<&[Vec<u8>]>)> = Vec::new();
            for p in prepared.iter().flatten() {
                match out.last_mut() {
                    _ if p.walk.is_some() => out.push((false, Vec::new())),
                    Some((s, list)) if *s == p.script && !list.is_empty() => {
                        list.push(p.args.as_slice())
                    }
                    _ => out.push((p.script, vec![p.args.as_slice()])),
                }
            }
            out
        };
        let mut walks = prepared.iter().flatten().filter_map(|p| p.walk.as_ref());
        let repeatable = prepared.iter().flatten().all(|p| !p.write);
        let mut replies = Vec::with_capacity(prepared.len());
        for (scripts, commands) in segments {
            if commands.is_empty() {
                // A walk's place.
                let Some(walk) = walks.next() else { continue };
                let answer = crate::upstash::scoped::run(
                    &state.upstash_conns,
                    walk,
                    budget,
                    config.request_timeout(),
                )
                .await;
                replies.push(match answer {
                    Ok(reply) => reply,
                    Err(Fault::TooLarge(n)) => Reply::Error(format!(
                        "ERR the reply is larger than limits.max_read_bytes ({n} bytes)"
                    )),
                    Err(e) => return Err(Failed::unavailable(format!("a keyspace walk: {e}"))),
                });
                continue;
            }
            let user = if scripts { script_user } else { None };
            let answers = exchange(state, config, user, &commands, atomic, scripts, repeatable)
                .await
                .inspect_err(|f| {
                    // Lost mid-way: a script may still be running.
                    if scripts && f.error.code().http_status() == 503 {
                        end_scripts(state, commands.len());
                    }
                })?;
            replies.extend(answers);
        }
        replies
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

/// One exchange on the door's own connections, inside MULTI/EXEC when `atomic`: the
/// commands' replies. A script may run as long as the request; anything else gets Redis's I/O
/// timeout.
async fn exchange(
    state: &State,
    config: &crate::config::Config,
    user: Option<(&str, &str)>,
    commands: &[&[Vec<u8>]],
    atomic: bool,
    scripts: bool,
    repeatable: bool,
) -> Result<Vec<Reply>, Failed> {
    let multi = [b"MULTI".to_vec()];
    let exec = [b"EXEC".to_vec()];
    let mut list: Vec<&[Vec<u8>]> = Vec::with_capacity(commands.len() + 2);
    if atomic {
        list.push(&multi);
    }
    list.extend(commands);
    if atomic {
        list.push(&exec);
    }
    let deadline = if scripts {
        config.request_timeout()
    } else {
        std::time::Duration::from_millis(config.redis.io_timeout_ms)
    };
    let budget = config.limits().read.max_bytes;
    let exchanged = state
        .upstash_conns
        .exchange(user, &list, budget, deadline, repeatable)
        .await;
    let mut replies = match exchanged {
        Ok(r) => r,
        Err(Fault::TooLarge(n)) => {
            return Err(Failed::bad(format!(
                "ERR the reply is larger than limits.max_read_bytes ({n} bytes)"
            )))
        }
        Err(Fault::Unavailable(e)) => return Err(Failed::unavailable(e)),
        Err(Fault::Lost(e)) if repeatable => {
            return Err(Failed::unavailable(format!("no complete answer: {e}")))
        }
        Err(Fault::Lost(e)) => {
            return Err(Failed {
                error: ApiError::CacheOutcomeUnknown {
                    internal: format!("no complete answer: {e}"),
                },
                message: "ERR the connection to redis was lost: the command may have run".into(),
            })
        }
    };
    if !atomic {
        return Ok(replies);
    }
    // MULTI's OK and each QUEUED go; EXEC's array answers the commands.
    match replies.pop() {
        Some(Reply::Array(answers)) => Ok(answers),
        Some(Reply::Error(e)) => Err(Failed::bad(e)),
        _ => Err(Failed::bad("EXECABORT Transaction discarded")),
    }
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

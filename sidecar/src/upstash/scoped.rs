//! Commands that name no key but have a clear meaning for a token: PING, ECHO and TIME as they
//! are; and, scoped to the token's namespace, the keyspace commands Upstash's clients iterate
//! with (SCAN, KEYS, DBSIZE, RANDOMKEY: the token's own keys, reported without the prefix),
//! SCAN's WITHTYPE (Upstash's own option), PUBLISH (its channels are namespaced as its keys
//! are), and FLUSHDB / FLUSHALL (the token's keys; the whole database for a token that owns
//! it).
//!
//! What a namespace's KEYS, DBSIZE, RANDOMKEY and FLUSHDB mean needs a walk over the keyspace.
//! The sidecar walks it (`run`): SCAN rounds of at most `ROUND` entries, each a short command
//! for Redis, so the door's Redis serves every other caller between them, and the whole walk
//! ends at the request's deadline. A Lua script would have done it in one round trip, and
//! blocked the door's Redis for every tenant for as long as the walk took. SCAN's COUNT is
//! capped at `ROUND` for the same reason.

use super::conns::{Conns, Fault};
use super::wire::Reply;
use super::{glob_escape, Door, Prepared, Refused, Then};
use std::time::Duration;

/// The entries one SCAN round may examine: short enough that Redis answers it in well under
/// a millisecond.
pub(crate) const ROUND: u64 = 1000;

/// A keyspace command the sidecar runs as a walk (`run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Walk {
    /// DBSIZE: how many keys match.
    Count { pattern: Vec<u8> },
    /// RANDOMKEY: a key that matches (the first a walk finds), or nil.
    Any { pattern: Vec<u8> },
    /// KEYS: every key that matches.
    Keys { pattern: Vec<u8> },
    /// FLUSHDB: unlink every key that matches.
    Flush { pattern: Vec<u8> },
    /// SCAN ... WITHTYPE: one SCAN round (these arguments), then each key's TYPE.
    Types { scan: Vec<Vec<u8>> },
}

/// None: not one of these (the command table decides).
pub(crate) fn prepare(
    name: &str,
    args: &[Vec<u8>],
    door: &Door<'_>,
) -> Option<Result<Prepared, Refused>> {
    let ns = door.namespace;
    let whole = ns.is_empty();
    let args = args.to_vec();
    let pattern = |p: &[u8]| {
        let mut out = glob_escape(ns).into_bytes();
        out.extend_from_slice(p);
        out
    };
    let walk = |w: Walk, write: bool, then: Then| {
        Some(Ok(Prepared {
            walk: Some(w),
            then,
            ..Prepared::keyless(Vec::new(), write)
        }))
    };
    match name {
        "ping" | "echo" | "time" => Some(Ok(Prepared::keyless(args, false))),
        "publish" if door.token.read_only => Some(Err(Refused(
            "NOPERM this token is read-only and cannot run 'publish'".into(),
        ))),
        "publish" => {
            let mut args = args;
            if let Some(channel) = args.get_mut(1) {
                super::prefix(channel, ns);
            }
            Some(Ok(Prepared::keyless(args, true)))
        }
        "flushdb" | "flushall" if door.token.read_only => Some(Err(Refused(format!(
            "NOPERM this token is read-only and cannot run '{name}'"
        )))),
        "flushdb" | "flushall" if !door.own_redis && whole => Some(Err(Refused(format!(
            "ERR Command is not allowed: {name} (it runs only on a Redis of the door's own)"
        )))),
        // One database is the token's whole Redis, as on Upstash.
        "flushdb" | "flushall" if whole => {
            let mut args = args;
            args[0] = b"FLUSHDB".to_vec();
            Some(Ok(Prepared::keyless(args, true)))
        }
        "flushdb" | "flushall" => walk(
            Walk::Flush {
                pattern: pattern(b"*"),
            },
            true,
            Then::AsIs,
        ),
        "scan" => {
            let Some(args) = scan_args(args, &pattern, whole) else {
                return Some(Err(Refused("ERR syntax error".into())));
            };
            match args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"WITHTYPE"))
            {
                None => Some(Ok(Prepared {
                    then: Then::Scan,
                    ..Prepared::keyless(args, false)
                })),
                Some(at) => {
                    let mut scan = args;
                    scan.remove(at);
                    walk(Walk::Types { scan }, false, Then::ScanWithTypes)
                }
            }
        }
        "keys" if whole => Some(Ok(Prepared::keyless(args, false))),
        "keys" => match args.get(1) {
            Some(p) if args.len() == 2 => walk(
                Walk::Keys {
                    pattern: pattern(p),
                },
                false,
                Then::Keys,
            ),
            _ => Some(Err(Refused(
                "ERR wrong number of arguments for 'keys' command".into(),
            ))),
        },
        "dbsize" | "randomkey" if whole => Some(Ok(Prepared::keyless(args, false))),
        "dbsize" | "randomkey" if args.len() != 1 => Some(Err(Refused(format!(
            "ERR wrong number of arguments for '{name}' command"
        )))),
        "dbsize" => walk(
            Walk::Count {
                pattern: pattern(b"*"),
            },
            false,
            Then::AsIs,
        ),
        "randomkey" => walk(
            Walk::Any {
                pattern: pattern(b"*"),
            },
            false,
            Then::Key,
        ),
        _ => None,
    }
}

/// SCAN's arguments with every MATCH in the namespace (Redis obeys the last one; a MATCH
/// left as sent would list every key), one added when there is none, and COUNT at most
/// `ROUND`. None: an option without its value.
fn scan_args(
    mut args: Vec<Vec<u8>>,
    pattern: &dyn Fn(&[u8]) -> Vec<u8>,
    whole: bool,
) -> Option<Vec<Vec<u8>>> {
    let mut matched = false;
    let mut i = 2;
    while i < args.len() {
        let option = args[i].to_ascii_uppercase();
        match option.as_slice() {
            b"MATCH" | b"COUNT" | b"TYPE" if i + 1 >= args.len() => return None,
            b"MATCH" => {
                if !whole {
                    args[i + 1] = pattern(&args[i + 1]);
                }
                matched = true;
                i += 2;
            }
            b"COUNT" => {
                let n = std::str::from_utf8(&args[i + 1])
                    .ok()?
                    .parse::<u64>()
                    .ok()?;
                args[i + 1] = n.min(ROUND).to_string().into_bytes();
                i += 2;
            }
            b"TYPE" => i += 2,
            _ => i += 1,
        }
    }
    if !matched && !whole {
        args.push(b"MATCH".to_vec());
        args.push(pattern(b"*"));
    }
    Some(args)
}

/// Runs a walk on the door's connections, every round within `budget` bytes and the whole
/// within `deadline`; the reply Redis's own command would have given.
pub(crate) async fn run(
    conns: &Conns,
    walk: &Walk,
    budget: usize,
    deadline: Duration,
) -> Result<Reply, Fault> {
    tokio::time::timeout(deadline, walked(conns, walk, budget, deadline))
        .await
        .unwrap_or_else(|_| {
            Err(Fault::Lost(
                "the walk did not end before the deadline".into(),
            ))
        })
}

async fn walked(
    conns: &Conns,
    walk: &Walk,
    budget: usize,
    deadline: Duration,
) -> Result<Reply, Fault> {
    let exchange = |commands: Vec<Vec<Vec<u8>>>, repeatable: bool| async move {
        let list: Vec<&[Vec<u8>]> = commands.iter().map(Vec::as_slice).collect();
        conns
            .exchange(None, &list, budget, deadline, repeatable)
            .await
    };
    if let Walk::Types { scan } = walk {
        let round = exchange(vec![scan.clone()], true).await?;
        let (cursor, keys) = scan_reply(round.into_iter().next())?;
        let types = exchange(
            keys.iter()
                .map(|k| vec![b"TYPE".to_vec(), k.clone()])
                .collect(),
            true,
        )
        .await?;
        let mut pairs = Vec::with_capacity(keys.len() * 2);
        for (key, kind) in keys.into_iter().zip(types) {
            pairs.push(Reply::Bulk(key));
            pairs.push(match kind {
                Reply::Status(s) => Reply::Bulk(s.into_bytes()),
                other => other,
            });
        }
        return Ok(Reply::Array(vec![Reply::Bulk(cursor), Reply::Array(pairs)]));
    }
    let pattern = match walk {
        Walk::Count { pattern }
        | Walk::Any { pattern }
        | Walk::Keys { pattern }
        | Walk::Flush { pattern } => pattern,
        Walk::Types { .. } => unreachable!("answered above"),
    };
    let (mut cursor, mut count, mut found, mut kept) = (b"0".to_vec(), 0i64, Vec::new(), 0usize);
    loop {
        let round = exchange(
            vec![vec![
                b"SCAN".to_vec(),
                cursor.clone(),
                b"MATCH".to_vec(),
                pattern.clone(),
                b"COUNT".to_vec(),
                ROUND.to_string().into_bytes(),
            ]],
            true,
        )
        .await?;
        let (next, keys) = scan_reply(round.into_iter().next())?;
        match walk {
            Walk::Count { .. } => count += keys.len() as i64,
            Walk::Any { .. } => {
                if let Some(k) = keys.into_iter().next() {
                    return Ok(Reply::Bulk(k));
                }
            }
            Walk::Keys { .. } => {
                kept += keys.iter().map(Vec::len).sum::<usize>();
                if kept > budget {
                    return Err(Fault::TooLarge(budget));
                }
                found.extend(keys.into_iter().map(Reply::Bulk));
            }
            Walk::Flush { .. } if !keys.is_empty() => {
                let mut unlink = vec![b"UNLINK".to_vec()];
                unlink.extend(keys);
                exchange(vec![unlink], false).await?;
            }
            _ => {}
        }
        if next == b"0" {
            break;
        }
        cursor = next;
    }
    Ok(match walk {
        Walk::Count { .. } => Reply::Int(count),
        Walk::Keys { .. } => Reply::Array(found),
        Walk::Flush { .. } => Reply::Status("OK".into()),
        _ => Reply::Nil,
    })
}

/// `[cursor, [keys]]`, as SCAN answers.
fn scan_reply(reply: Option<Reply>) -> Result<(Vec<u8>, Vec<Vec<u8>>), Fault> {
    let bad = || Fault::Lost("an unexpected answer to SCAN".into());
    match reply {
        Some(Reply::Array(mut parts)) if parts.len() == 2 => {
            let keys = match parts.pop() {
                Some(Reply::Array(keys)) => keys
                    .into_iter()
                    .map(|k| match k {
                        Reply::Bulk(k) => Ok(k),
                        _ => Err(bad()),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                _ => return Err(bad()),
            };
            match parts.pop() {
                Some(Reply::Bulk(cursor)) => Ok((cursor, keys)),
                _ => Err(bad()),
            }
        }
        Some(Reply::Error(e)) => Err(Fault::Lost(format!("SCAN: {e}"))),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &str) -> Vec<Vec<u8>> {
        a.split(' ').map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn every_match_goes_in_the_namespace_and_count_is_capped() {
        let pattern = |p: &[u8]| {
            let mut out = b"ns:".to_vec();
            out.extend_from_slice(p);
            out
        };
        assert_eq!(
            scan_args(
                args("SCAN 0 MATCH x MATCH * COUNT 100000000"),
                &pattern,
                false
            ),
            Some(args("SCAN 0 MATCH ns:x MATCH ns:* COUNT 1000"))
        );
        assert_eq!(
            scan_args(args("SCAN 0 match * TYPE string"), &pattern, false),
            Some(args("SCAN 0 match ns:* TYPE string"))
        );
        assert_eq!(
            scan_args(args("SCAN 0"), &pattern, false),
            Some(args("SCAN 0 MATCH ns:*"))
        );
        assert_eq!(scan_args(args("SCAN 0 MATCH"), &pattern, false), None);
        assert_eq!(
            scan_args(args("SCAN 0 COUNT 5"), &pattern, true),
            Some(args("SCAN 0 COUNT 5"))
        );
    }
}

//! Commands that name no key but have a clear meaning for a token: PING, ECHO and TIME as they
//! are; and, scoped to the token's namespace, the keyspace commands Upstash's clients iterate
//! with (SCAN, KEYS, DBSIZE, RANDOMKEY: the token's own keys, reported without the prefix),
//! SCAN's WITHTYPE (Upstash's own option), PUBLISH (its channels are namespaced as its keys
//! are), and FLUSHDB / FLUSHALL (the token's keys; the whole database for a token that owns
//! it).
//!
//! DBSIZE, RANDOMKEY and FLUSHDB inside a namespace, and SCAN's WITHTYPE, run as short scripts
//! of Ferry's on the door's own Redis (as the door's URL user, never a token's script user): a
//! scan of the namespace inside Redis, in one round trip. Like KEYS, they take time in
//! proportion to the whole database, as Redis's own FLUSHDB does.

use super::{glob_escape, Door, Prepared, Refused, Then};

/// Counts the keys matching ARGV[1].
const COUNT: &str = "local n, c = 0, '0' repeat \
    local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) \
    c = r[1] n = n + #r[2] until c == '0' return n";

/// A key under ARGV[2] (matching ARGV[1]): RANDOMKEY's when it lands there within a few tries
/// (a namespace that holds most keys), else the first a scan finds.
const ANY: &str = "for i = 1, 16 do local k = redis.call('RANDOMKEY') \
    if not k then return false end \
    if string.sub(k, 1, #ARGV[2]) == ARGV[2] then return k end end \
    local c = '0' repeat local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) \
    c = r[1] if #r[2] > 0 then return r[2][1] end until c == '0' return false";

/// Deletes every key matching ARGV[1] (FLUSHDB inside a namespace).
const FLUSH: &str = "local c = '0' repeat \
    local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) c = r[1] \
    if #r[2] > 0 then redis.call('UNLINK', unpack(r[2])) end until c == '0' \
    return redis.status_reply('OK')";

/// SCAN with its arguments, each key followed by its type (Upstash's `SCAN ... WITHTYPE`).
const SCAN_WITH_TYPES: &str = "local r = redis.call('SCAN', unpack(ARGV)) local out = {} \
    for _, k in ipairs(r[2]) do out[#out + 1] = k \
    out[#out + 1] = redis.call('TYPE', k)['ok'] end return {r[1], out}";

/// None: not one of these (the command table decides).
pub fn prepare(name: &str, args: &[Vec<u8>], door: &Door<'_>) -> Option<Result<Prepared, Refused>> {
    let ns = door.namespace;
    let whole = ns.is_empty();
    let args = args.to_vec();
    let refused = |why: &str| {
        Some(Err(Refused(format!(
            "ERR Command is not allowed: {name} ({why})"
        ))))
    };
    let pattern = |p: &[u8]| {
        let mut out = glob_escape(ns).into_bytes();
        out.extend_from_slice(p);
        out
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
        "flushdb" | "flushall" if !door.own_redis => {
            refused("it runs only on a Redis of the door's own")
        }
        "flushdb" | "flushall" if !whole => {
            // The token's keys, all of them: a scan and delete inside Redis.
            let args = vec![
                b"EVAL".to_vec(),
                FLUSH.as_bytes().to_vec(),
                b"0".to_vec(),
                pattern(b"*"),
            ];
            Some(Ok(Prepared::keyless(args, true)))
        }
        "flushdb" | "flushall" => {
            // One database is the token's whole Redis, as on Upstash.
            let mut args = args;
            args[0] = b"FLUSHDB".to_vec();
            Some(Ok(Prepared::keyless(args, true)))
        }
        "scan" => {
            let mut args = args;
            if !whole {
                match args.iter().position(|a| a.eq_ignore_ascii_case(b"MATCH")) {
                    Some(i) if i + 1 < args.len() => args[i + 1] = pattern(&args[i + 1]),
                    Some(_) => return Some(Err(Refused("ERR syntax error".into()))),
                    None => {
                        args.push(b"MATCH".to_vec());
                        args.push(pattern(b"*"));
                    }
                }
            }
            let Some(with_type) = args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"WITHTYPE"))
            else {
                return Some(Ok(Prepared {
                    then: Then::Scan,
                    ..Prepared::keyless(args, false)
                }));
            };
            if !door.own_redis {
                return refused("WITHTYPE runs only on a Redis of the door's own");
            }
            args.remove(with_type);
            let mut eval = vec![
                b"EVAL".to_vec(),
                SCAN_WITH_TYPES.as_bytes().to_vec(),
                b"0".to_vec(),
            ];
            eval.extend(args.into_iter().skip(1));
            Some(Ok(Prepared {
                then: Then::ScanWithTypes,
                ..Prepared::keyless(eval, false)
            }))
        }
        "keys" => {
            let mut args = args;
            if let (false, Some(p)) = (whole, args.get_mut(1)) {
                *p = pattern(p);
            }
            Some(Ok(Prepared {
                then: Then::Keys,
                ..Prepared::keyless(args, false)
            }))
        }
        "dbsize" | "randomkey" if whole => Some(Ok(Prepared::keyless(args, false))),
        "dbsize" | "randomkey" if !door.own_redis => {
            refused("inside a namespace it runs only on a Redis of the door's own")
        }
        "dbsize" | "randomkey" if args.len() != 1 => Some(Err(Refused(format!(
            "ERR wrong number of arguments for '{name}' command"
        )))),
        "dbsize" | "randomkey" => {
            let script = if name == "dbsize" { COUNT } else { ANY };
            let args = vec![
                b"EVAL".to_vec(),
                script.as_bytes().to_vec(),
                b"0".to_vec(),
                pattern(b"*"),
                ns.as_bytes().to_vec(),
            ];
            Some(Ok(Prepared {
                then: if name == "randomkey" {
                    Then::Key
                } else {
                    Then::AsIs
                },
                ..Prepared::keyless(args, false)
            }))
        }
        _ => None,
    }
}

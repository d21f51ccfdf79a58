//! EVAL and friends, and SCRIPT LOAD / EXISTS: only on the door's own Redis (a script can stop
//! the Redis it runs on), and only for a token with a script user (Redis's ACL then keeps the
//! script to the namespace, whatever key names it builds) or one that owns the whole database.
//! A read-only token runs only scripts already loaded (`EVALSHA_RO`): a new script body stays
//! in Redis's memory for good. The declared keys are put in the namespace like any other.
//!
//! Functions (FUNCTION, FCALL, FCALL_RO) are one library space for the whole Redis, so only a
//! token that owns the whole database runs them (read-only: FCALL_RO and FUNCTION LIST / STATS);
//! SCRIPT FLUSH likewise.
//!
//! A script's shebang may carry flags this Redis does not know (`#!lua
//! flags=allow-key-locking`, which `@upstash/ratelimit` sends; Redis 7 refuses the script):
//! they are dropped, and since the body Redis holds is then not the one the client hashed, the
//! client's SHA1 is mapped to Redis's for EVALSHA and SCRIPT EXISTS, and SCRIPT LOAD answers
//! the client's.

use super::wire::Reply;
use super::{prefix, Door, Prepared, Refused, Then};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

const SCRIPTS: [&str; 8] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "script",
    "function",
    "fcall",
    "fcall_ro",
];

/// The shebang flags Redis 7 knows; others are dropped.
const KNOWN_FLAGS: [&str; 5] = [
    "no-writes",
    "allow-oom",
    "allow-stale",
    "no-cluster",
    "allow-cross-slot-keys",
];

/// Client SHA1 -> Redis's, for rewritten scripts, per namespace, at most this many each: a
/// caller could send endless bodies, and filling its own namespace's map must not empty
/// another tenant's (a read-only token cannot load its scripts again).
const MAX_MAPPED: usize = 1024;

type Mapped = HashMap<String, HashMap<String, String>>;

fn mapped() -> std::sync::MutexGuard<'static, Mapped> {
    static MAP: OnceLock<Mutex<Mapped>> = OnceLock::new();
    MAP.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

pub(super) fn is_script(name: &str) -> bool {
    SCRIPTS.contains(&name)
}

pub(super) fn prepare(
    name: String,
    mut args: Vec<Vec<u8>>,
    door: &Door<'_>,
) -> Result<Prepared, Refused> {
    let (token, namespace) = (door.token, door.namespace);
    if !door.own_redis {
        return Err(Refused(format!(
            "ERR Command is not allowed: {name} (scripts run only on a Redis of the door's own: \
             upstash.redis_url)"
        )));
    }
    // Every token's scripts run as a script user, a whole-database token's too: as the door's
    // own user a script could SELECT another database, SWAPDB or MIGRATE to any host.
    if token.script_user.is_empty() {
        return Err(Refused(format!(
            "ERR Command is not allowed: {name} (this token has no script_user: a Redis ACL \
             user limited to its keys)"
        )));
    }
    let script = |args, then| Prepared {
        args,
        script: true,
        write: true,
        first_key: None,
        allocates: 0,
        then,
        walk: None,
    };
    let sub = args
        .get(1)
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase());
    let whole = token.prefix.is_empty();
    if name == "function" || name.starts_with("fcall") {
        if !whole {
            return Err(Refused(format!(
                "ERR Command is not allowed: {name} (functions are one library for the whole \
                 Redis: only a token that owns the whole database may use them)"
            )));
        }
        let reads = name == "fcall_ro" || matches!(sub.as_deref(), Some("list" | "stats"));
        if token.read_only && !reads {
            return Err(Refused(format!(
                "NOPERM this token is read-only and cannot run '{name}'"
            )));
        }
        let first_key =
            if name == "function" {
                match sub.as_deref() {
                    Some("load" | "delete" | "flush" | "list" | "stats" | "kill") => None,
                    _ => return Err(Refused(
                        "ERR Command is not allowed: function (only LOAD, DELETE, FLUSH, LIST, \
                         STATS and KILL)"
                            .into(),
                    )),
                }
            } else {
                numkeys(&args)?.gt(&0).then_some(3)
            };
        return Ok(Prepared {
            first_key,
            write: !reads,
            ..script(args, Then::AsIs)
        });
    }
    if name == "script" {
        return match sub.as_deref() {
            Some("flush") if whole && !token.read_only => Ok(script(args, Then::AsIs)),
            Some("load") if token.read_only => Err(Refused(
                "NOPERM this token is read-only and cannot load scripts".into(),
            )),
            Some("load") if args.len() == 3 => {
                let answer = rewrite(namespace, &mut args[2])
                    .map(|sha| Then::Answer(Reply::Bulk(sha.into())));
                Ok(script(args, answer.unwrap_or_default()))
            }
            Some("exists") => {
                for sha in &mut args[2..] {
                    translate(namespace, sha);
                }
                Ok(script(args, Then::AsIs))
            }
            _ => Err(Refused(
                "ERR Command is not allowed: script (only LOAD and EXISTS; FLUSH for a token \
                 that owns the whole database)"
                    .into(),
            )),
        };
    }
    if token.read_only && name != "evalsha_ro" {
        return Err(Refused(format!(
            "NOPERM this token is read-only and runs only loaded scripts with EVALSHA_RO, not \
             '{name}'"
        )));
    }
    let numkeys = numkeys(&args)?;
    for key in &mut args[3..3 + numkeys] {
        prefix(key, namespace);
    }
    if name.starts_with("evalsha") {
        translate(namespace, &mut args[1]);
    } else {
        rewrite(namespace, &mut args[1]);
    }
    let declared = args[3..3 + numkeys].to_vec();
    let then = if namespace.is_empty() || declared.is_empty() {
        Then::AsIs
    } else {
        Then::DeclaredKeys(declared)
    };
    Ok(Prepared {
        first_key: (numkeys > 0).then_some(3),
        ..script(args, then)
    })
}

/// EVAL's and FCALL's `numkeys` (argument 2), checked against the arguments there are.
fn numkeys(args: &[Vec<u8>]) -> Result<usize, Refused> {
    args.get(2)
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| n.checked_add(3).is_some_and(|end| end <= args.len()))
        .ok_or_else(|| Refused("ERR Number of keys can't be greater than number of args".into()))
}

/// Drops the shebang flags Redis does not know from `body`; when it did, remembers the
/// client's SHA1 for the new body's and returns the client's.
fn rewrite(namespace: &str, body: &mut Vec<u8>) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let options = first.strip_prefix("#!lua")?;
    let mut kept = Vec::new();
    let mut dropped = false;
    let mut words: Vec<String> = Vec::new();
    for word in options.split_whitespace() {
        match word.strip_prefix("flags=") {
            Some(flags) => {
                for f in flags.split(',').filter(|f| !f.is_empty()) {
                    if KNOWN_FLAGS.contains(&f) {
                        kept.push(f);
                    } else {
                        dropped = true;
                    }
                }
                words.push(format!("flags={}", kept.join(",")));
            }
            None => words.push(word.to_string()),
        }
    }
    if !dropped {
        return None;
    }
    let client = sha1(body);
    let mut new = String::from("#!lua");
    for w in &words {
        new.push(' ');
        new.push_str(w);
    }
    new.push('\n');
    new.push_str(rest);
    let ours = sha1(new.as_bytes());
    let mut all = mapped();
    let map = all.entry(namespace.to_string()).or_default();
    if map.len() >= MAX_MAPPED {
        map.clear();
    }
    map.insert(client.clone(), ours);
    *body = new.into_bytes();
    Some(client)
}

/// The SHA1 Redis knows the client's script by.
fn translate(namespace: &str, sha: &mut Vec<u8>) {
    let key = String::from_utf8_lossy(sha).to_ascii_lowercase();
    if let Some(ours) = mapped().get(namespace).and_then(|m| m.get(&key)) {
        *sha = ours.clone().into_bytes();
    }
}

fn sha1(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_numkeys_past_any_integer_is_refused_not_a_panic() {
        let args = |n: &str| vec![b"EVALSHA_RO".to_vec(), b"x".to_vec(), n.as_bytes().to_vec()];
        assert!(numkeys(&args("18446744073709551615")).is_err());
        assert!(numkeys(&args("1")).is_err());
        assert_eq!(numkeys(&args("0")), Ok(0));
    }

    #[test]
    fn unknown_shebang_flags_are_dropped_and_the_clients_sha_still_finds_the_script() {
        let original = b"#!lua flags=allow-key-locking,no-writes\nreturn 1".to_vec();
        let mut body = original.clone();
        let client = rewrite("a:", &mut body).expect("rewritten");
        assert_eq!(body, b"#!lua flags=no-writes\nreturn 1");
        assert_eq!(client, sha1(&original));
        let mut sha = client.clone().into_bytes();
        translate("a:", &mut sha);
        assert_eq!(sha, sha1(&body).into_bytes());
        // Another namespace's map is its own: filling it empties nothing of a:'s.
        for i in 0..MAX_MAPPED + 1 {
            let mut other = format!("#!lua flags=zz\nreturn {i}").into_bytes();
            rewrite("b:", &mut other);
        }
        let mut sha = client.into_bytes();
        translate("a:", &mut sha);
        assert_eq!(sha, sha1(&body).into_bytes());
        // Known flags only, or no shebang: left as they are.
        for same in [
            &b"#!lua flags=no-writes\nreturn 1"[..],
            b"return 1",
            b"#!lua\nreturn 1",
        ] {
            let mut b = same.to_vec();
            assert_eq!(rewrite("a:", &mut b), None);
            assert_eq!(b, same);
        }
    }
}

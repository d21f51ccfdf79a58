//! Upstash's Redis REST protocol (what `@upstash/redis` and `upstash-redis` speak): a command
//! is a JSON array (`["SET", "k", "v"]`), the answer `{"result": ...}` or `{"error": "..."}`.
//!
//! Which commands run, and where their keys are, comes from Redis's own command table
//! (`COMMAND`, read once): a command runs only if it names its keys at fixed positions (so
//! every key can be put under the token's namespace) and is not in a refused category
//! (administration, dangerous, blocking, pub/sub, scripting); PING, ECHO and TIME need no key.
//! Read-only tokens are refused every command Redis flags as a write.

pub mod acl;
mod bounds;
pub mod cluster;
pub mod conns;
mod encode;
pub mod wire;

pub use bounds::Bounds;
pub use encode::{from_redis, to_json};
use wire::Reply;

use crate::config::UpstashToken;
use std::collections::HashMap;

/// Who is asking, and where: what every command of a request is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Door<'a> {
    pub token: &'a UpstashToken,
    /// Where its keys live (`UpstashConfig::namespace`).
    pub namespace: &'a str,
    /// Whether the door runs on a Redis of its own (`upstash.redis_url`): scripts run only there.
    pub own_redis: bool,
    pub bounds: Bounds,
}

/// Categories (Redis ACL categories) whose commands are refused: they reach beyond one
/// caller's keys (@admin, @dangerous: FLUSHALL, CONFIG, DEBUG, KEYS, SHUTDOWN, MONITOR...),
/// hold a connection (@blocking, @pubsub), or could touch any key from inside (@scripting:
/// EVAL names its keys, but a script can reach others).
/// @transaction and @connection: the connection is shared by every caller (WATCH, MULTI,
/// SELECT, CLIENT would change it for all).
const REFUSED: [&str; 7] = [
    "@admin",
    "@dangerous",
    "@blocking",
    "@pubsub",
    "@scripting",
    "@connection",
    "@transaction",
];
/// Commands without keys that cannot reach anyone's data.
const KEYLESS: [&str; 3] = ["ping", "echo", "time"];

/// One command as Redis describes it.
#[derive(Debug, Clone)]
struct Spec {
    /// 1-based positions: first key, last key (negative: from the end), step. 0: no keys.
    first: i64,
    last: i64,
    step: i64,
    write: bool,
    refused: Option<String>,
}

/// Redis's command table, as far as this protocol needs it.
#[derive(Debug, Default)]
pub struct Commands {
    specs: HashMap<String, Spec>,
}

/// Why a command was refused, in Upstash's words (sent as `{"error": ...}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// A command ready to send, and whether it must run as the token's script user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub args: Vec<Vec<u8>>,
    pub script: bool,
    /// It may write (Redis's `write` flag; scripts always): not sent again after a lost
    /// connection, since it may have run.
    pub write: bool,
    /// Where its first key is among `args` (what routes it on a Redis Cluster); None: no key.
    pub first_key: Option<usize>,
    /// What it may make Redis allocate beyond what it carries (`bounds`), in bytes.
    pub allocates: usize,
}

impl Prepared {
    /// The hash slot the command runs in on a Redis Cluster (a keyless one: slot 0's node).
    pub fn slot(&self) -> u16 {
        self.first_key
            .and_then(|i| self.args.get(i))
            .map_or(0, |k| crate::store::redis::slot(k))
    }
}

/// Scripts: the declared keys sit after `numkeys` at argument 2; the `_ro` forms refuse writes.
const SCRIPTS: [&str; 4] = ["eval", "evalsha", "eval_ro", "evalsha_ro"];

impl Commands {
    /// From the reply to `COMMAND` (RESP2: one array per command).
    pub fn from_reply(reply: &Reply) -> Commands {
        let mut specs = HashMap::new();
        let Reply::Array(all) = reply else {
            return Commands { specs };
        };
        for c in all {
            let Reply::Array(f) = c else { continue };
            let text = |v: &Reply| match v {
                Reply::Status(s) => s.to_ascii_lowercase(),
                Reply::Bulk(b) => String::from_utf8_lossy(b).to_ascii_lowercase(),
                _ => String::new(),
            };
            let int = |v: Option<&Reply>| match v {
                Some(Reply::Int(i)) => *i,
                _ => 0,
            };
            let list = |v: Option<&Reply>| match v {
                Some(Reply::Array(a)) => a.iter().map(text).collect::<Vec<_>>(),
                _ => Vec::new(),
            };
            let Some(name) = f.first().map(text) else {
                continue;
            };
            let flags = list(f.get(2));
            let categories = list(f.get(6));
            let refused = categories
                .iter()
                .find(|c| REFUSED.contains(&c.as_str()))
                .map(|c| format!("ERR Command is not allowed: {name} ({c})"))
                .or_else(|| {
                    flags
                        .iter()
                        .any(|f| f == "movablekeys")
                        .then(|| format!("ERR Command is not allowed: {name} (its keys move)"))
                });
            specs.insert(
                name,
                Spec {
                    first: int(f.get(3)),
                    last: int(f.get(4)),
                    step: int(f.get(5)),
                    write: flags.iter().any(|f| f == "write"),
                    refused,
                },
            );
        }
        Commands { specs }
    }

    /// Checks one command for the door's token and puts its keys under its namespace.
    pub fn prepare(&self, args: Vec<Vec<u8>>, door: &Door<'_>) -> Result<Prepared, Refused> {
        let (token, namespace) = (door.token, door.namespace);
        let Some(name) = args
            .first()
            .map(|n| String::from_utf8_lossy(n).to_ascii_lowercase())
        else {
            return Err(Refused("ERR empty command".into()));
        };
        if KEYLESS.contains(&name.as_str()) {
            return Ok(Prepared {
                args,
                script: false,
                write: false,
                first_key: None,
                allocates: 0,
            });
        }
        if SCRIPTS.contains(&name.as_str()) || name == "script" {
            return script(name, args, door);
        }
        let allocates = bounds::check(&name, &args, door.bounds)?;
        let Some(spec) = self.specs.get(&name) else {
            return Err(Refused(format!("ERR Command is not available: '{name}'")));
        };
        if let Some(why) = &spec.refused {
            return Err(Refused(why.clone()));
        }
        if spec.first == 0 {
            return Err(Refused(format!(
                "ERR Command is not allowed: {name} (it names no key of its own)"
            )));
        }
        if token.read_only && spec.write {
            return Err(Refused(format!(
                "NOPERM this token is read-only and cannot run '{name}'"
            )));
        }
        let mut args = args;
        let n = args.len() as i64;
        let last = if spec.last < 0 {
            n + spec.last
        } else {
            spec.last
        };
        let mut i = spec.first;
        while i <= last && i < n {
            prefix(&mut args[i as usize], namespace);
            i += spec.step.max(1);
        }
        Ok(Prepared {
            args,
            script: false,
            write: spec.write,
            first_key: usize::try_from(spec.first).ok(),
            allocates,
        })
    }
}

fn prefix(key: &mut Vec<u8>, namespace: &str) {
    let mut prefixed = namespace.as_bytes().to_vec();
    prefixed.extend_from_slice(key);
    *key = prefixed;
}

/// EVAL and friends, and SCRIPT LOAD / EXISTS: only on the door's own Redis (a script can stop
/// the Redis it runs on), and only for a token with a script user (Redis's ACL then keeps the
/// script to the namespace, whatever key names it builds) or one that owns the whole database.
/// A read-only token runs only scripts already loaded (`EVALSHA_RO`): a new script body stays
/// in Redis's memory for good. The declared keys are put in the namespace like any other.
fn script(name: String, mut args: Vec<Vec<u8>>, door: &Door<'_>) -> Result<Prepared, Refused> {
    let (token, namespace) = (door.token, door.namespace);
    if !door.own_redis {
        return Err(Refused(format!(
            "ERR Command is not allowed: {name} (scripts run only on a Redis of the door's own: \
             upstash.redis_url)"
        )));
    }
    if token.script_user.is_empty() && !token.prefix.is_empty() {
        return Err(Refused(format!(
            "ERR Command is not allowed: {name} (this token has no script_user: a Redis ACL \
             user limited to its keys)"
        )));
    }
    if name == "script" {
        let sub = args
            .get(1)
            .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase());
        return match sub.as_deref() {
            Some("load") if token.read_only => Err(Refused(
                "NOPERM this token is read-only and cannot load scripts".into(),
            )),
            Some("load") | Some("exists") => Ok(Prepared {
                args,
                script: true,
                write: true,
                first_key: None,
                allocates: 0,
            }),
            _ => Err(Refused(
                "ERR Command is not allowed: script (only LOAD and EXISTS)".into(),
            )),
        };
    }
    if token.read_only && name != "evalsha_ro" {
        return Err(Refused(format!(
            "NOPERM this token is read-only and runs only loaded scripts with EVALSHA_RO, not \
             '{name}'"
        )));
    }
    let numkeys = args
        .get(2)
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| 3 + n <= args.len())
        .ok_or_else(|| Refused("ERR Number of keys can't be greater than number of args".into()))?;
    for key in &mut args[3..3 + numkeys] {
        prefix(key, namespace);
    }
    Ok(Prepared {
        args,
        script: true,
        write: true,
        first_key: (numkeys > 0).then_some(3),
        allocates: 0,
    })
}

/// A JSON array of strings and numbers as command arguments.
pub fn arguments(v: &serde_json::Value) -> Result<Vec<Vec<u8>>, Refused> {
    let serde_json::Value::Array(items) = v else {
        return Err(Refused("ERR a command is a JSON array".into()));
    };
    if items.is_empty() {
        return Err(Refused("ERR empty command".into()));
    }
    items
        .iter()
        .map(|a| match a {
            serde_json::Value::String(s) => Ok(s.as_bytes().to_vec()),
            serde_json::Value::Number(n) => Ok(n.to_string().into_bytes()),
            serde_json::Value::Bool(b) => Ok(b.to_string().into_bytes()),
            _ => Err(Refused(
                "ERR command arguments are strings or numbers".into(),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::Reply as V;

    fn cmd(name: &str, flags: &[&str], first: i64, last: i64, step: i64, cats: &[&str]) -> V {
        let s = |x: &str| V::Status(x.into());
        V::Array(vec![
            V::Bulk(name.as_bytes().to_vec()),
            V::Int(-2),
            V::Array(flags.iter().map(|f| s(f)).collect()),
            V::Int(first),
            V::Int(last),
            V::Int(step),
            V::Array(cats.iter().map(|c| s(c)).collect()),
        ])
    }

    fn table() -> Commands {
        Commands::from_reply(&V::Array(vec![
            cmd("get", &["readonly"], 1, 1, 1, &["@read"]),
            cmd("mset", &["write"], 1, -1, 2, &["@write"]),
            cmd("flushall", &["write"], 0, 0, 0, &["@write", "@dangerous"]),
            cmd("dbsize", &["readonly"], 0, 0, 0, &["@keyspace"]),
            cmd("eval", &["movablekeys"], 0, 0, 0, &["@scripting"]),
            cmd("ping", &[], 0, 0, 0, &["@fast", "@connection"]),
        ]))
    }

    fn token(read_only: bool) -> UpstashToken {
        UpstashToken {
            token: "t".repeat(32).into(),
            prefix: "a:".into(),
            read_only,
            ..Default::default()
        }
    }

    fn args(a: &[&str]) -> Vec<Vec<u8>> {
        a.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn door<'a>(token: &'a UpstashToken, namespace: &'a str, own_redis: bool) -> Door<'a> {
        Door {
            token,
            namespace,
            own_redis,
            bounds: Bounds {
                max_bytes: 1 << 20,
                max_items: 1000,
            },
        }
    }

    #[test]
    fn keys_go_under_the_namespace_and_values_do_not() {
        let t = table();
        let (rw, ro) = (token(false), token(true));
        let out = t
            .prepare(
                args(&["MSET", "k1", "v1", "k2", "v2"]),
                &door(&rw, "f:u:a:", false),
            )
            .expect("allowed");
        assert_eq!(
            out.args,
            args(&["MSET", "f:u:a:k1", "v1", "f:u:a:k2", "v2"])
        );
        assert_eq!(
            t.prepare(args(&["GET", "k"]), &door(&ro, "p:", false))
                .expect("read")
                .args,
            args(&["GET", "p:k"])
        );
        let mut scripted = token(false);
        scripted.script_user = "u".into();
        scripted.script_password = "p".to_string().into();
        let eval = t
            .prepare(
                args(&["EVAL", "return 1", "1", "k", "arg"]),
                &door(&scripted, "p:", true),
            )
            .expect("a script user, on the door's own Redis");
        assert!(eval.script);
        assert_eq!(eval.args, args(&["EVAL", "return 1", "1", "p:k", "arg"]));
        assert!(t
            .prepare(
                args(&["EVAL", "return 1", "5", "k"]),
                &door(&scripted, "p:", true)
            )
            .is_err());
        // Not on the cache's Redis, whatever the token.
        assert!(t
            .prepare(
                args(&["EVAL", "return 1", "0"]),
                &door(&scripted, "p:", false)
            )
            .is_err());
    }

    #[test]
    fn dangerous_keyless_scripted_unknown_and_writes_on_read_only_are_refused() {
        let t = table();
        for (a, ro) in [
            (&["FLUSHALL"][..], false),
            (&["DBSIZE"][..], false),
            (&["EVAL", "return 1", "0"][..], false),
            (&["NOPE"][..], false),
            (&["MSET", "k", "v"][..], true),
        ] {
            let tok = token(ro);
            assert!(
                t.prepare(args(a), &door(&tok, "p:", false)).is_err(),
                "{a:?}"
            );
        }
        let tok = token(true);
        assert!(t.prepare(args(&["PING"]), &door(&tok, "p:", false)).is_ok());
        // A read-only token loads no script, and runs no script body.
        let mut scripted = token(true);
        scripted.script_user = "u".into();
        for a in [
            &["SCRIPT", "LOAD", "return 1"][..],
            &["EVAL_RO", "return 1", "0"][..],
        ] {
            assert!(
                t.prepare(args(a), &door(&scripted, "p:", true)).is_err(),
                "{a:?}"
            );
        }
        assert!(t
            .prepare(
                args(&["EVALSHA_RO", "abc", "0"]),
                &door(&scripted, "p:", true)
            )
            .is_ok());
    }
}

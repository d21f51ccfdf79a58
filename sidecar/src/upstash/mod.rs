//! Upstash's Redis REST protocol (what `@upstash/redis` and `upstash-redis` speak): a command
//! is a JSON array (`["SET", "k", "v"]`), the answer `{"result": ...}` or `{"error": "..."}`.
//!
//! Each command is checked and put under the token's namespace before it is sent
//! (`commands`: Redis's own command table says where its keys are); the few that name no key
//! but have a clear meaning inside a namespace are rewritten (`scoped`: SCAN, KEYS, DBSIZE,
//! RANDOMKEY, PUBLISH, FLUSHDB); scripts have rules of their own (`scripts`). Replies that name
//! keys are given back without the namespace (`Then`).

pub(crate) mod acl;
mod bounds;
pub(crate) mod cluster;
mod commands;
pub(crate) mod conns;
mod encode;
mod keyspec;
pub(crate) mod scoped;
mod scripts;
pub(crate) mod wire;

pub(crate) use bounds::Bounds;
pub(crate) use commands::Commands;
pub(crate) use encode::{from_redis, to_json};
use wire::Reply;

use crate::config::UpstashToken;

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
    /// What to do with Redis's reply before the caller sees it.
    pub then: Then,
    /// Not one command but a walk over the keyspace, run by the sidecar (`scoped::run`).
    pub walk: Option<scoped::Walk>,
}

/// A reply's last step: key names in it lose the namespace, or the caller gets another answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Then {
    #[default]
    AsIs,
    /// The reply is a key name (RANDOMKEY).
    Key,
    /// An array of key names (KEYS).
    Keys,
    /// `[cursor, [keys]]` (SCAN).
    Scan,
    /// `[cursor, [key, type, key, type...]]` (SCAN WITHTYPE).
    ScanWithTypes,
    /// `[key, ...]` (LMPOP, ZMPOP).
    FirstIsKey,
    /// `[[key, entries], ...]` (XREAD, XREADGROUP).
    EachFirstIsKey,
    /// A script's reply: any string in it equal to one of these keys it was given (namespaced)
    /// is a key, and loses the namespace; other key names a script builds cannot be told from
    /// values (API.md says so).
    DeclaredKeys(Vec<Vec<u8>>),
    /// This answer instead (SCRIPT LOAD of a rewritten script: the SHA the caller computed).
    Answer(Reply),
}

impl Prepared {
    /// A command with no key, sent as it is.
    fn keyless(args: Vec<Vec<u8>>, write: bool) -> Prepared {
        Prepared {
            args,
            script: false,
            write,
            first_key: None,
            allocates: 0,
            then: Then::AsIs,
            walk: None,
        }
    }

    /// The hash slot the command runs in on a Redis Cluster (a keyless one: slot 0's node).
    pub fn slot(&self) -> u16 {
        self.first_key
            .and_then(|i| self.args.get(i))
            .map_or(0, |k| crate::store::redis::slot(k))
    }

    /// Redis's reply as the caller must see it (`then`).
    pub fn finish(&self, reply: Reply, namespace: &str) -> Reply {
        let strip = |r: Reply| match r {
            Reply::Bulk(k) => Reply::Bulk(
                k.strip_prefix(namespace.as_bytes())
                    .map_or(k.clone(), <[u8]>::to_vec),
            ),
            other => other,
        };
        let strip_all = |r: Reply| match r {
            Reply::Array(keys) => Reply::Array(keys.into_iter().map(strip).collect()),
            other => other,
        };
        let strip_first = |r: Reply| match r {
            Reply::Array(mut items) if !items.is_empty() => {
                let first = strip(items.remove(0));
                items.insert(0, first);
                Reply::Array(items)
            }
            other => other,
        };
        if matches!(reply, Reply::Error(_)) {
            return reply;
        }
        match &self.then {
            Then::AsIs => reply,
            Then::Key => strip(reply),
            Then::Keys => strip_all(reply),
            Then::Scan => match reply {
                Reply::Array(mut parts) if parts.len() == 2 => {
                    let keys = strip_all(parts.pop().unwrap_or(Reply::Nil));
                    parts.push(keys);
                    Reply::Array(parts)
                }
                other => other,
            },
            Then::ScanWithTypes => match reply {
                Reply::Array(mut parts) if parts.len() == 2 => {
                    if let Some(Reply::Array(pairs)) = parts.pop() {
                        let pairs = pairs
                            .into_iter()
                            .enumerate()
                            .map(|(i, r)| if i % 2 == 0 { strip(r) } else { r })
                            .collect();
                        parts.push(Reply::Array(pairs));
                    }
                    Reply::Array(parts)
                }
                other => other,
            },
            Then::FirstIsKey => strip_first(reply),
            Then::EachFirstIsKey => match reply {
                Reply::Array(streams) => {
                    Reply::Array(streams.into_iter().map(strip_first).collect())
                }
                other => other,
            },
            Then::DeclaredKeys(keys) => unprefix_declared(reply, keys, namespace),
            Then::Answer(a) => a.clone(),
        }
    }
}

/// `reply` with every string equal to one of `keys` stripped of `namespace`, at any depth.
fn unprefix_declared(reply: Reply, keys: &[Vec<u8>], namespace: &str) -> Reply {
    match reply {
        Reply::Bulk(b) if keys.contains(&b) => Reply::Bulk(b[namespace.len()..].to_vec()),
        Reply::Array(items) => Reply::Array(
            items
                .into_iter()
                .map(|r| unprefix_declared(r, keys, namespace))
                .collect(),
        ),
        other => other,
    }
}

fn prefix(key: &mut Vec<u8>, namespace: &str) {
    let mut prefixed = namespace.as_bytes().to_vec();
    prefixed.extend_from_slice(key);
    *key = prefixed;
}

/// `namespace` as a Redis glob that matches only itself.
pub(crate) fn glob_escape(namespace: &str) -> String {
    let mut out = String::with_capacity(namespace.len());
    for c in namespace.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A JSON array of strings and numbers as command arguments.
pub(crate) fn arguments(v: &serde_json::Value) -> Result<Vec<Vec<u8>>, Refused> {
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

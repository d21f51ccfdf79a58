//! A token's script user is checked before its first script: Redis's ACL is what keeps a
//! script to the token's keys, so an ACL that lets the user list every key (SCAN, KEYS), reach
//! another database (SELECT, MOVE, SWAPDB), wipe or reconfigure the server, or read a key
//! outside the namespace would give the token all of that through EVAL. Asked with
//! `ACL DRYRUN` (Redis 7), which runs nothing, and `ACL GETUSER` for its key patterns; the
//! verdict is kept per user and namespace (a reload forgets it, as a password may have
//! changed). Commands Redis never runs inside a script (SCRIPT, FUNCTION, ...) are not asked.

use super::conns::{Conns, Fault};
use super::wire::Reply;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// What a namespaced token's script user must not be able to run: list or count every key,
/// or empty the database (a token that owns the whole database may).
const KEYSPACE: [&[&str]; 5] = [
    &["SCAN", "0"],
    &["KEYS", "*"],
    &["RANDOMKEY"],
    &["DBSIZE"],
    &["FLUSHDB"],
];

/// What no script user may run (each refused by its ACL); `@` stands for a key of its own
/// namespace, so that only the command, not the key, can be what is refused. COPY is on the
/// list because an ACL cannot tell `COPY a b` from `COPY a b DB 5`; SORT because its BY and
/// GET patterns read keys the ACL's key check never sees named; GEORADIUS and
/// GEORADIUSBYMEMBER because Redis 7.0's ACL checks the first STORE of `STORE a STORE b` and
/// writes the last (redis/redis#15478); MIGRATE because it reaches other servers; PUBSUB
/// because it lists every tenant's channels; the rest read or change the server itself.
const FORBIDDEN: [&[&str]; 23] = [
    &["SELECT", "1"],
    &["MOVE", "@", "1"],
    &["COPY", "@", "@2", "DB", "1"],
    &["SWAPDB", "0", "1"],
    &["FLUSHALL"],
    &["CONFIG", "GET", "maxmemory"],
    &["SORT", "@", "BY", "nosort", "GET", "@*"],
    &["GEORADIUS", "@", "0", "0", "1", "m"],
    &["GEORADIUSBYMEMBER", "@", "x", "1", "m"],
    &["MIGRATE", "127.0.0.1", "1", "@", "0", "1"],
    &["PUBSUB", "CHANNELS"],
    &["PUBSUB", "NUMSUB"],
    &["INFO"],
    &["SLOWLOG", "GET"],
    &["MEMORY", "DOCTOR"],
    &["MEMORY", "STATS"],
    &["CLIENT", "LIST"],
    &["DEBUG", "SLEEP", "0"],
    &["LATENCY", "LATEST"],
    &["ACL", "LIST"],
    &["SAVE"],
    &["SHUTDOWN"],
    &["REPLICAOF", "NO", "ONE"],
];

/// Verdicts so far, by user and namespace (two tokens may share a user, not a namespace).
#[derive(Default)]
pub(crate) struct Checked {
    verdicts: Mutex<HashMap<(String, String), Result<(), String>>>,
}

impl Checked {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Result<(), String>>> {
        self.verdicts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn forget_all(&self) {
        self.lock().clear();
    }

    /// Ok if `user`'s ACL keeps it to `namespace` (asked once; an unreachable Redis is asked
    /// again next time). Err: why its scripts are refused.
    pub(crate) async fn verdict(
        &self,
        conns: &Conns,
        user: &str,
        namespace: &str,
    ) -> Result<(), String> {
        let key = (user.to_string(), namespace.to_string());
        if let Some(v) = self.lock().get(&key) {
            return v.clone();
        }
        let arg = |a: &str| match a.strip_prefix('@') {
            Some(rest) => format!("{namespace}ferry-acl-probe{rest}").into_bytes(),
            None => a.as_bytes().to_vec(),
        };
        let keyspace: &[&[&str]] = if namespace.is_empty() { &[] } else { &KEYSPACE };
        let mut probes: Vec<Vec<Vec<u8>>> = keyspace
            .iter()
            .chain(FORBIDDEN.iter())
            .map(|c| dryrun(user, c.iter().map(|a| arg(a))))
            .collect();
        if !namespace.is_empty() {
            // A key outside the namespace (a prefix has no control characters).
            let outside = b"\x01ferry-acl-probe".to_vec();
            probes.push(dryrun(user, [b"GET".to_vec(), outside].into_iter()));
        }
        probes.push(vec![
            b"ACL".to_vec(),
            b"GETUSER".to_vec(),
            user.as_bytes().to_vec(),
        ]);
        let list: Vec<&[Vec<u8>]> = probes.iter().map(Vec::as_slice).collect();
        let answers = match conns
            .exchange(None, &list, 1 << 20, Duration::from_secs(2), true)
            .await
        {
            Ok(a) => a,
            Err(e @ (Fault::Unavailable(_) | Fault::Lost(_) | Fault::TooLarge(_))) => {
                return Err(format!("its ACL could not be checked: {e}"));
            }
        };
        let mut allowed = Vec::new();
        let (dryruns, getuser) = answers.split_at(answers.len().saturating_sub(1));
        for (probe, answer) in probes.iter().zip(dryruns) {
            match answer {
                Reply::Status(ok) if ok == "OK" => {
                    allowed.push(String::from_utf8_lossy(&probe[3]).into_owned())
                }
                // A denial is a bulk string ("This user has no permissions ..."); an error
                // means the question could not be asked (no such user, Redis before 7).
                Reply::Error(e) => {
                    return Err(format!("its ACL could not be checked (ACL DRYRUN): {e}"));
                }
                _ => {}
            }
        }
        let verdict = if !allowed.is_empty() {
            Err(format!(
                "its ACL lets it run {} (a script could reach past the token's keys)",
                allowed.join(", ")
            ))
        } else {
            keys_exactly(getuser.first(), namespace)
        };
        if let Err(why) = &verdict {
            tracing::error!(user, "upstash: scripts refused for this script user: {why}");
        }
        self.lock().insert(key, verdict.clone());
        verdict
    }
}

fn dryrun(user: &str, command: impl Iterator<Item = Vec<u8>>) -> Vec<Vec<u8>> {
    let mut out = vec![
        b"ACL".to_vec(),
        b"DRYRUN".to_vec(),
        user.as_bytes().to_vec(),
    ];
    out.extend(command);
    out
}

/// The user's key patterns (`ACL GETUSER`) must be exactly its namespace's, with no selectors:
/// a second pattern (`~app:* ~other:*`) passes every probe above and still reaches other keys.
/// A whole-database token (empty namespace) may have any.
fn keys_exactly(getuser: Option<&Reply>, namespace: &str) -> Result<(), String> {
    if namespace.is_empty() {
        return Ok(());
    }
    let fields = match getuser {
        Some(Reply::Array(f)) => f,
        Some(Reply::Error(e)) => return Err(format!("its ACL could not be read: {e}")),
        _ => return Err("its ACL could not be read (no such user)".into()),
    };
    let field = |name: &str| {
        fields
            .chunks(2)
            .find(|kv| matches!(&kv[0], Reply::Bulk(k) if k == name.as_bytes()))
            .and_then(|kv| kv.get(1))
    };
    let want = format!("~{}*", super::glob_escape(namespace));
    let keys = match field("keys") {
        Some(Reply::Bulk(k)) => String::from_utf8_lossy(k).into_owned(),
        _ => String::new(),
    };
    if keys != want && keys != format!("%RW{want}") {
        return Err(format!(
            "its ACL's key patterns are `{keys}`; they must be exactly `{want}` (resetkeys {want})"
        ));
    }
    if let Some(Reply::Array(selectors)) = field("selectors") {
        if !selectors.is_empty() {
            return Err(
                "its ACL has selectors: a selector can reach other keys (clearselectors)".into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(keys: &str, selectors: usize) -> Reply {
        Reply::Array(vec![
            Reply::Bulk(b"flags".to_vec()),
            Reply::Array(vec![]),
            Reply::Bulk(b"keys".to_vec()),
            Reply::Bulk(keys.as_bytes().to_vec()),
            Reply::Bulk(b"selectors".to_vec()),
            Reply::Array(vec![Reply::Array(vec![]); selectors]),
        ])
    }

    #[test]
    fn key_patterns_must_be_the_namespace_alone() {
        assert!(keys_exactly(Some(&user("~app:*", 0)), "app:").is_ok());
        assert!(keys_exactly(Some(&user("%RW~app:*", 0)), "app:").is_ok());
        assert!(keys_exactly(Some(&user("~app:* ~other:*", 0)), "app:").is_err());
        assert!(keys_exactly(Some(&user("~*", 0)), "app:").is_err());
        assert!(keys_exactly(Some(&user("%R~app:*", 0)), "app:").is_err());
        assert!(keys_exactly(Some(&user("~app:*", 1)), "app:").is_err());
        assert!(keys_exactly(Some(&Reply::Nil), "app:").is_err());
        assert!(keys_exactly(Some(&user("~a\\*b:*", 0)), "a*b:").is_ok());
        assert!(keys_exactly(Some(&user("~a*b:*", 0)), "a*b:").is_err());
        assert!(keys_exactly(None, "").is_ok());
    }
}

//! A token's script user is checked before its first script: Redis's ACL is what keeps a
//! script to the token's keys, so an ACL that lets the user list every key (SCAN, KEYS), reach
//! another database (SELECT, MOVE, SWAPDB), wipe or reconfigure the server, or read a key
//! outside the namespace would give the token all of that through EVAL. Asked with
//! `ACL DRYRUN` (Redis 7), which runs nothing; the verdict is kept per user (a reload forgets
//! it, as a password may have changed).

use super::conns::{Conns, Fault};
use super::wire::Reply;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// What a script user must not be able to run (each refused by its ACL); `@` stands for a key
/// of its own namespace, so that only the command, not the key, can be what is refused. COPY
/// is on the list because an ACL cannot tell `COPY a b` from `COPY a b DB 5`.
const FORBIDDEN: [&[&str]; 11] = [
    &["SCAN", "0"],
    &["KEYS", "*"],
    &["RANDOMKEY"],
    &["DBSIZE"],
    &["SELECT", "1"],
    &["MOVE", "@", "1"],
    &["COPY", "@", "@2", "DB", "1"],
    &["SWAPDB", "0", "1"],
    &["FLUSHALL"],
    &["FLUSHDB"],
    &["CONFIG", "GET", "maxmemory"],
];

/// Verdicts so far, by user.
#[derive(Default)]
pub struct Checked {
    verdicts: Mutex<HashMap<String, Result<(), String>>>,
}

impl Checked {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Result<(), String>>> {
        self.verdicts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn forget_all(&self) {
        self.lock().clear();
    }

    /// Ok if `user`'s ACL keeps it to `namespace` (asked once; an unreachable Redis is asked
    /// again next time). Err: why its scripts are refused.
    pub async fn verdict(&self, conns: &Conns, user: &str, namespace: &str) -> Result<(), String> {
        if let Some(v) = self.lock().get(user) {
            return v.clone();
        }
        let arg = |a: &str| match a.strip_prefix('@') {
            Some(rest) => format!("{namespace}ferry-acl-probe{rest}").into_bytes(),
            None => a.as_bytes().to_vec(),
        };
        let mut probes: Vec<Vec<Vec<u8>>> = FORBIDDEN
            .iter()
            .map(|c| dryrun(user, c.iter().map(|a| arg(a))))
            .collect();
        if !namespace.is_empty() {
            // A key outside the namespace (a prefix has no control characters).
            let outside = b"\x01ferry-acl-probe".to_vec();
            probes.push(dryrun(user, [b"GET".to_vec(), outside].into_iter()));
        }
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
        for (probe, answer) in probes.iter().zip(&answers) {
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
        let verdict = if allowed.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "its ACL lets it run {} (a script could reach past the token's keys)",
                allowed.join(", ")
            ))
        };
        if let Err(why) = &verdict {
            tracing::error!(user, "upstash: scripts refused for this script user: {why}");
        }
        self.lock().insert(user.to_string(), verdict.clone());
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

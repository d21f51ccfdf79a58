//! `[neon]`: the Neon-compatible SQL-over-HTTP endpoint (`POST /sql`), and the tokens it
//! accepts as connection-string passwords.

use super::{Config, ConfigError, Redacted};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NeonConfig {
    /// Serve `POST /sql` as Neon's SQL-over-HTTP does, so `@neondatabase/serverless` (and
    /// Drizzle's `neon-http`) work by pointing `fetchEndpoint` at the sidecar.
    pub enabled: bool,
    /// The tokens callers put as the password of their connection string: `[[neon.tokens]]`.
    pub tokens: Vec<NeonToken>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NeonToken {
    /// At least 32 characters of randomness: the whole credential (the user, host and
    /// database of the connection string are not checked, and never connected to).
    pub token: Redacted<String>,
    /// Every statement runs in a read-only transaction, enforced by Postgres.
    #[serde(default)]
    pub read_only: bool,
    /// The login role its statements run as (`postgres://role:password@host/db`), a role of
    /// its own: a token runs any SQL, so a role shared with another token or with
    /// `postgres.url` could read that one's statements (`pg_stat_activity`) and end its
    /// sessions. Empty: `postgres.url`'s role, allowed only with `postgres.single_role`.
    #[serde(default)]
    pub postgres_url: super::RedactedUrl,
    /// Connections each worker keeps for this token's role (so at most this times
    /// `server.workers` for the token).
    #[serde(default = "one")]
    pub sessions_per_worker: usize,
    /// Seconds to cache every single read this token sends (1 to `cache.max_ttl_s`), on the
    /// tables Postgres says it reads, so existing `neon()` code is cached with no code change;
    /// a read that could not stay fresh is answered uncached (`Ferry-Cache: bypass` and
    /// `Ferry-Cache-Reason`). Needs `[changes]` on. Unset: only reads that ask
    /// (`Ferry-Cache-TTL`, `ferry_cache_ttl`) are cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ttl_s: Option<u64>,
}

fn one() -> usize {
    1
}

impl Config {
    pub(super) fn validate_neon(&self) -> Result<(), ConfigError> {
        let invalid = |key: String, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.into(),
            })
        };
        let n = &self.neon;
        if n.enabled && n.tokens.is_empty() {
            return invalid("neon.tokens".into(), "give at least one token");
        }
        for (i, t) in n.tokens.iter().enumerate() {
            if t.token.len() < 32 {
                return invalid(format!("neon.tokens[{i}].token"), "at least 32 characters");
            }
            // The token travels inside a URL: characters that need escaping there would make
            // the client's string and ours differ.
            if !t
                .token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
            {
                return invalid(
                    format!("neon.tokens[{i}].token"),
                    "letters, digits and - . _ ~ only (it is a URL password)",
                );
            }
            if n.tokens[..i]
                .iter()
                .any(|o| o.token.as_str() == t.token.as_str())
            {
                return invalid(format!("neon.tokens[{i}]"), "tokens must be distinct");
            }
            if let Some(ttl) = t.cache_ttl_s {
                if ttl == 0 || ttl > self.cache.max_ttl_s {
                    return invalid(
                        format!("neon.tokens[{i}].cache_ttl_s"),
                        "1 to cache.max_ttl_s seconds",
                    );
                }
                if !self.changes.enabled {
                    return invalid(
                        format!("neon.tokens[{i}].cache_ttl_s"),
                        "caching /sql reads needs [changes] on: writes sent to /sql carry no \
                         invalidation, so only the change stream drops what they make stale",
                    );
                }
            }
            if t.postgres_url.is_empty() && !self.postgres.single_role {
                return invalid(
                    format!("neon.tokens[{i}].postgres_url"),
                    "give the token a login role of its own (scripts/demo.sql makes ferry_neon \
                     and ferry_neon_ro), or set postgres.single_role = true (unsafe)",
                );
            }
            // A role's sessions can cancel and end each other (pg_cancel_backend,
            // pg_terminate_backend) and read each other's statements (pg_stat_activity): a
            // token's role is its own, shared with no other token and none of Ferry's.
            if !self.postgres.single_role && !t.postgres_url.is_empty() {
                let role = role_of(t.postgres_url.as_str());
                let taken = [
                    ("postgres.url", self.postgres.url.as_str()),
                    ("postgres.owner_url", self.postgres.owner_url.as_str()),
                ]
                .into_iter()
                .map(|(k, u)| (k.to_string(), role_of(u)))
                .chain(n.tokens[..i].iter().enumerate().map(|(j, o)| {
                    (
                        format!("neon.tokens[{j}].postgres_url"),
                        role_of(o.postgres_url.as_str()),
                    )
                }))
                .find(|(_, r)| r.is_some() && *r == role);
                if let Some((other, _)) = taken {
                    return invalid(
                        format!("neon.tokens[{i}].postgres_url"),
                        &format!(
                            "its role is also {other}'s: give each token a login role of its \
                             own (one role's sessions can cancel and read each other's)"
                        ),
                    );
                }
            }
            if t.sessions_per_worker == 0 {
                return invalid(
                    format!("neon.tokens[{i}].sessions_per_worker"),
                    "must be at least 1",
                );
            }
        }
        if n.enabled && self.postgres.pool_size as usize * 3 / 4 < self.server.worker_count() {
            // /sql runs on the workers' event-loop sessions (see store::postgres::loop_session).
            return invalid(
                "postgres.pool_size".into(),
                "with [neon] on, at least 4/3 of server.workers (each worker needs a session)",
            );
        }
        Ok(())
    }
}

/// The role a Postgres URL logs in as (None when it names none or does not parse).
fn role_of(url: &str) -> Option<String> {
    url.parse::<postgres::Config>()
        .ok()
        .and_then(|c| c.get_user().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, NeonToken};

    fn with_tokens(urls: &[&str]) -> Config {
        let mut c = Config::default();
        c.postgres.url = "postgres://ferry_app@h/db".to_string().into();
        c.neon.tokens = urls
            .iter()
            .enumerate()
            .map(|(i, u)| NeonToken {
                token: format!("{i}").repeat(32).into(),
                postgres_url: u.to_string().into(),
                sessions_per_worker: 1,
                ..Default::default()
            })
            .collect();
        c
    }

    #[test]
    fn a_tokens_role_is_its_own() {
        let ok = with_tokens(&[
            "postgres://ferry_neon@h/db",
            "postgres://ferry_neon_ro@h/db",
        ]);
        assert_eq!(ok.validate_neon().map_err(|e| e.to_string()), Ok(()));
        let shared = with_tokens(&["postgres://ferry_neon@h/db", "postgres://ferry_neon@h2/db"]);
        let err = shared.validate_neon().unwrap_err().to_string();
        assert!(err.contains("neon.tokens[0]"), "{err}");
        let requests = with_tokens(&["postgres://ferry_app:pw@h/db"]);
        let err = requests.validate_neon().unwrap_err().to_string();
        assert!(err.contains("postgres.url"), "{err}");
    }
}

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
            if t.postgres_url.is_empty() && !self.postgres.single_role {
                return invalid(
                    format!("neon.tokens[{i}].postgres_url"),
                    "give the token a login role of its own (scripts/demo.sql makes ferry_neon \
                     and ferry_neon_ro), or set postgres.single_role = true (unsafe)",
                );
            }
            if t.sessions_per_worker == 0 {
                return invalid(
                    format!("neon.tokens[{i}].sessions_per_worker"),
                    "must be at least 1",
                );
            }
        }
        if n.enabled && self.postgres.pool_size as usize * 3 / 4 < self.server.worker_count() {
            // /sql runs on the workers' event-loop sessions (see store::pg_async).
            return invalid(
                "postgres.pool_size".into(),
                "with [neon] on, at least 4/3 of server.workers (each worker needs a session)",
            );
        }
        Ok(())
    }
}

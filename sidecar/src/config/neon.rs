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

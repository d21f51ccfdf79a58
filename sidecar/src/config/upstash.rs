//! `[upstash]`: the Upstash-compatible Redis REST endpoints, and the bearer tokens they accept.

use super::{Config, ConfigError, Redacted};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstashConfig {
    /// Serve `POST /`, `/pipeline` and `/multi-exec` as Upstash's Redis REST API does, so
    /// `@upstash/redis` and `upstash-redis` work by changing their URL and token.
    pub enabled: bool,
    /// The tokens callers send as `Authorization: Bearer <token>`: `[[upstash.tokens]]`.
    pub tokens: Vec<UpstashToken>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstashToken {
    /// At least 32 characters of randomness (the token is the whole credential).
    pub token: Redacted<String>,
    /// The namespace: every key this token names is stored under it in Redis (after
    /// `cache.key_prefix`), so tokens never see each other's keys.
    pub prefix: String,
    /// Refuse commands that write (Upstash's read-only tokens).
    #[serde(default)]
    pub read_only: bool,
    /// A Redis ACL user whose keys are this token's namespace only (`~<cache.key_prefix>u:
    /// <prefix>*`): scripts (EVAL, EVALSHA) run as that user, so Redis itself stops a script
    /// that reaches another key. Empty: scripts are refused.
    #[serde(default)]
    pub script_user: String,
    /// That user's password.
    #[serde(default)]
    pub script_password: Redacted<String>,
}

impl Config {
    pub(super) fn validate_upstash(&self) -> Result<(), ConfigError> {
        let invalid = |key: String, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.into(),
            })
        };
        let u = &self.upstash;
        if u.enabled && u.tokens.is_empty() {
            return invalid("upstash.tokens".into(), "give at least one token");
        }
        for (i, t) in u.tokens.iter().enumerate() {
            if t.token.len() < 32 {
                return invalid(
                    format!("upstash.tokens[{i}].token"),
                    "at least 32 characters",
                );
            }
            if t.prefix.is_empty() || t.prefix.chars().any(char::is_control) {
                return invalid(
                    format!("upstash.tokens[{i}].prefix"),
                    "non-empty, no control characters",
                );
            }
            if t.script_user.is_empty() != t.script_password.is_empty() {
                return invalid(
                    format!("upstash.tokens[{i}].script_user"),
                    "set script_user and script_password together, or neither",
                );
            }
            // Two tokens may share a namespace (a read-write and a read-only one, as Upstash
            // gives each database), but no namespace may contain another's keys.
            let clash = u.tokens[..i].iter().any(|o| {
                o.token.as_str() == t.token.as_str()
                    || (o.prefix != t.prefix
                        && (o.prefix.starts_with(&t.prefix) || t.prefix.starts_with(&o.prefix)))
            });
            if clash {
                return invalid(
                    format!("upstash.tokens[{i}]"),
                    "tokens must be distinct, and no prefix may start another",
                );
            }
        }
        Ok(())
    }
}

//! `[identity]`: the end-user roles a signed request may run its statements as, so Postgres
//! row-level security applies per user.

use super::{Config, ConfigError, Redacted};
use serde::{Deserialize, Serialize};

/// Claims larger than this (as JSON, in bytes) are refused: they travel in every request and
/// sit in a Postgres setting for the statement's length.
pub const MAX_CLAIMS_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConfig {
    /// The Postgres roles a request's `identity.role` may name (`["anon", "authenticated"]`).
    /// Empty (the default): requests that carry an identity are refused. The sidecar's login
    /// role must be a member of each (`GRANT authenticated TO ferry`), and none may be a
    /// superuser or have BYPASSRLS: the sidecar checks both at startup.
    pub roles: Vec<String>,
    /// The setting that holds the claims as JSON, read in SQL with
    /// `current_setting('request.jwt.claims', true)::json ->> 'sub'` (PostgREST's name, so
    /// existing policies work unchanged). Must contain a dot (a custom setting).
    pub claims_setting: String,
    /// Let a request with an identity run raw SQL. Off by default because SQL can end the
    /// assumed role (`SET ROLE NONE`, `set_config('role', ...)`) and read as the sidecar's own
    /// role, past row-level security; with it off, identities run only `[queries.NAME]`
    /// statements, which the config's author wrote. Turn it on only if every raw statement is
    /// written by you, never built from user input.
    pub allow_raw_sql: bool,
    /// Requests per second one end user (an identity's role and `sub` claim, or its whole
    /// claims without one) may send, on average; 0 (the default) turns the limit off. Counted
    /// in Redis, so it holds across sidecars; past it: 429 `rate_limited` with Retry-After.
    pub rate_per_s: u32,
    /// How many requests one end user may send at once above the rate (the bucket's size).
    pub burst: u32,
    /// End users' JWTs verified by the sidecar itself (the Neon driver's `authToken`, sent to
    /// `/sql` as `Authorization: Bearer`): the HS256 secret, at least 32 bytes (prefer
    /// `jwt_secret_file` or FERRY_IDENTITY_JWT_SECRET). Empty with an empty `jwks_url`: such
    /// requests are refused.
    pub jwt_secret: Redacted<String>,
    pub jwt_secret_file: String,
    /// The auth provider's JWKS (RS256 and ES256 tokens), fetched over HTTPS (plain HTTP only on
    /// loopback) and kept `jwks_ttl_s` seconds (refetched sooner, at most every 30 s, for a key
    /// it does not hold yet).
    pub jwks_url: String,
    pub jwks_ttl_s: u64,
    /// When set, a token's `aud` must be (or contain) it, and its `iss` must equal this.
    pub jwt_audience: String,
    pub jwt_issuer: String,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        IdentityConfig {
            roles: Vec::new(),
            claims_setting: "request.jwt.claims".into(),
            allow_raw_sql: false,
            rate_per_s: 0,
            burst: 20,
            jwt_secret: Redacted(String::new()),
            jwt_secret_file: String::new(),
            jwks_url: String::new(),
            jwks_ttl_s: 600,
            jwt_audience: String::new(),
            jwt_issuer: String::new(),
        }
    }
}

/// A role name as Postgres spells an unquoted one, so config and requests compare exactly.
fn valid_role(r: &str) -> bool {
    (1..=63).contains(&r.len())
        && r.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && r.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A custom setting name: `prefix.name`, each part an unquoted identifier.
fn valid_setting(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() >= 2 && s.len() <= 63 && parts.iter().all(|p| valid_role(p))
}

impl Config {
    pub(super) fn validate_identity(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: key.into(),
                message,
            })
        };
        let c = &self.identity;
        for (i, r) in c.roles.iter().enumerate() {
            if !valid_role(r) {
                return invalid(
                    &format!("identity.roles[{i}]"),
                    format!("{r:?} is not a lower-case role name (a-z, 0-9, _; at most 63)"),
                );
            }
        }
        if c.rate_per_s > 0 && c.burst == 0 {
            return invalid(
                "identity.burst",
                "must be at least 1 when rate_per_s is set".into(),
            );
        }
        if c.rate_per_s > 1_000_000 {
            return invalid(
                "identity.rate_per_s",
                "at most 1000000 (0 turns it off)".into(),
            );
        }
        if !c.jwt_secret.is_empty() && c.jwt_secret.len() < ferry_shared::jwt::MIN_SECRET_LEN {
            return invalid(
                "identity.jwt_secret",
                format!(
                    "at least {} bytes (HS256 needs a 256-bit key)",
                    ferry_shared::jwt::MIN_SECRET_LEN
                ),
            );
        }
        if !c.jwks_url.is_empty() {
            let ok = match c.jwks_url.split_once("://") {
                Some(("https", _)) => true,
                Some(("http", rest)) => {
                    let host = rest.split(['/', ':']).next().unwrap_or_default();
                    matches!(host, "127.0.0.1" | "localhost" | "[") || rest.starts_with("[::1]")
                }
                _ => false,
            };
            if !ok {
                return invalid(
                    "identity.jwks_url",
                    "an https:// URL (plain http only on loopback)".into(),
                );
            }
            if c.jwks_ttl_s == 0 {
                return invalid("identity.jwks_ttl_s", "at least 1".into());
            }
        }
        if !valid_setting(&c.claims_setting) {
            return invalid(
                "identity.claims_setting",
                format!(
                    "{:?} is not a custom setting name (prefix.name, lower case)",
                    c.claims_setting
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(valid_role("authenticated") && valid_role("app_user_2"));
        for bad in ["", "Admin", "a-b", "x;drop", "\"q\"", "1abc"] {
            assert!(!valid_role(bad), "{bad:?}");
        }
        assert!(valid_setting("request.jwt.claims"));
        for bad in ["claims", "request..x", "Request.x", "a.b c"] {
            assert!(!valid_setting(bad), "{bad:?}");
        }
    }
}

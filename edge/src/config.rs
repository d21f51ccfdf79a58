//! The edge's bindings: `FERRY_SIDECAR_URL` and `FERRY_TIMEOUT_MS` (wrangler vars) and
//! `FERRY_SECRET` (a secret: `.dev.vars` locally, `wrangler secret put` in production).

use crate::error::EdgeError;

/// Var: the sidecar's base URL (https, or http to a loopback address).
pub const VAR_SIDECAR_URL: &str = "FERRY_SIDECAR_URL";
/// Var: the per-call timeout, in milliseconds.
pub const VAR_TIMEOUT_MS: &str = "FERRY_TIMEOUT_MS";
/// Var: `"true"` allows plain http to a non-loopback sidecar (a private link).
pub const VAR_ALLOW_HTTP: &str = "FERRY_ALLOW_HTTP";
/// Secret: the HMAC key shared with the sidecar.
pub const SECRET: &str = "FERRY_SECRET";
/// The bearer key for writes and the cache routes (a secret: `wrangler secret put`).
pub const API_KEY: &str = "FERRY_API_KEY";
/// Secret binding: the HS256 key end users' JWTs are signed with (at least 32 bytes). Without
/// it the per-user routes (`/me/...`) refuse everyone.
pub const JWT_SECRET: &str = "FERRY_JWT_SECRET";
/// Optional var: `"false"` sends every read on its own instead of batching concurrent ones.
pub const VAR_AUTO_BATCH: &str = "FERRY_AUTO_BATCH";
/// Optional var: the JWKS URL of the auth provider, for RS256 and ES256 tokens.
pub const VAR_JWKS_URL: &str = "FERRY_JWKS_URL";
/// Optional vars: the `aud` and `iss` a JWT must carry.
pub const VAR_JWT_AUDIENCE: &str = "FERRY_JWT_AUDIENCE";
/// Var: the `iss` every end-user token must carry.
pub const VAR_JWT_ISSUER: &str = "FERRY_JWT_ISSUER";

/// Optional binding: a Workers rate limiter (`[[ratelimits]]` in wrangler.toml) that anonymous
/// reads are counted against per client address, before any sidecar call.
pub const ANON_LIMIT: &str = "ANON_LIMIT";

/// Per-call timeout when `FERRY_TIMEOUT_MS` is not set, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;

#[derive(Debug, Clone, PartialEq, Eq)]
/// The Worker's validated bindings for reaching the sidecar.
pub struct EdgeConfig {
    /// Base URL without a trailing slash, e.g. `https://sidecar.example.com`.
    pub sidecar_url: String,
    /// Per-call timeout, in milliseconds.
    pub timeout_ms: u64,
    /// The HMAC key shared with the sidecar (never logged).
    pub secret: String,
}

/// Whether `host` (possibly `[::1]`) is this machine, decided on the parsed address:
/// `127.0.0.1.example.com` is not.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A URL binding, checked: http(s) with a host and no user information; plain http only to a
/// loopback host unless `http_ok` (`FERRY_ALLOW_HTTP=true`).
fn checked_url(var: &str, raw: Option<String>, http_ok: bool) -> Result<String, EdgeError> {
    let url = raw
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| EdgeError::Misconfigured(format!("{var} is not set")))?;
    let url = url.trim().trim_end_matches('/').to_string();
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| EdgeError::Misconfigured(format!("{var} must start with https://")))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // A user-info part ("http://127.0.0.1@evil.example") names no host: refused.
    if authority.contains('@') {
        return Err(EdgeError::Misconfigured(format!(
            "{var} must not contain user information (user@host)"
        )));
    }
    let host = authority;
    let host_only = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    if host_only.is_empty() {
        return Err(EdgeError::Misconfigured(format!("{var} has no host")));
    }
    match scheme {
        "https" => {}
        "http" if is_loopback(host_only) || http_ok => {}
        "http" => {
            return Err(EdgeError::Misconfigured(format!(
                "{var} uses plain http to a non-loopback host; use https, or set \
                 {VAR_ALLOW_HTTP}=true if the link is private"
            )))
        }
        _ => {
            return Err(EdgeError::Misconfigured(format!(
                "{var} must be an http(s) URL"
            )))
        }
    }
    Ok(url)
}

/// `FERRY_JWKS_URL`, when set: where the end users' RS256/ES256 public keys are published.
pub fn jwks_url(
    raw: Option<String>,
    allow_http: Option<String>,
) -> Result<Option<String>, EdgeError> {
    match raw.filter(|u| !u.trim().is_empty()) {
        None => Ok(None),
        Some(u) => {
            let http_ok = allow_http.as_deref().map(str::trim) == Some("true");
            checked_url(VAR_JWKS_URL, Some(u), http_ok).map(Some)
        }
    }
}

impl EdgeConfig {
    /// Validates raw binding values. Plain http is allowed only to a loopback sidecar, unless
    /// `FERRY_ALLOW_HTTP=true`: the signature protects integrity, not the data's privacy.
    pub fn from_bindings(
        sidecar_url: Option<String>,
        timeout_ms: Option<String>,
        allow_http: Option<String>,
        secret: Option<String>,
    ) -> Result<EdgeConfig, EdgeError> {
        let http_ok = allow_http.as_deref().map(str::trim) == Some("true");
        let url = checked_url(VAR_SIDECAR_URL, sidecar_url, http_ok)?;
        let timeout_ms = match timeout_ms.as_deref().map(str::trim) {
            None | Some("") => DEFAULT_TIMEOUT_MS,
            Some(t) => t
                .parse::<u64>()
                .ok()
                .filter(|t| (1..=120_000).contains(t))
                .ok_or_else(|| {
                    EdgeError::Misconfigured(format!(
                        "{VAR_TIMEOUT_MS} must be 1 to 120000 milliseconds"
                    ))
                })?,
        };
        let secret = secret.unwrap_or_default();
        if secret.len() < 16 {
            return Err(EdgeError::Misconfigured(format!(
                "{SECRET} is missing or shorter than 16 bytes"
            )));
        }
        Ok(EdgeConfig {
            sidecar_url: url,
            timeout_ms,
            secret,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str, allow: Option<&str>) -> Result<EdgeConfig, EdgeError> {
        EdgeConfig::from_bindings(
            Some(url.into()),
            None,
            allow.map(String::from),
            Some("0123456789abcdef".into()),
        )
    }

    #[test]
    fn urls() {
        assert_eq!(
            cfg("http://127.0.0.1:8787/", None).map(|c| c.sidecar_url),
            Ok("http://127.0.0.1:8787".into())
        );
        assert!(cfg("https://sidecar.example.com", None).is_ok());
        assert!(cfg("http://localhost:1", None).is_ok());
        assert!(cfg("http://[::1]:8787", None).is_ok());
        assert!(cfg("http://sidecar.example.com", None).is_err());
        assert!(cfg("http://127.0.0.1@sidecar.example.com", None).is_err());
        assert!(cfg("http://127.0.0.1.example.com", None).is_err());
        assert!(cfg("http://127.db.example.com:8787", None).is_err());
        assert!(cfg("http://127.0.0.2:8787", None).is_ok());
        assert!(cfg("http://sidecar.example.com", Some("true")).is_ok());
        assert!(cfg("ftp://x", None).is_err());
        assert!(cfg("sidecar", None).is_err());
        assert!(cfg("https://", None).is_err());
    }

    #[test]
    fn timeout_and_secret() {
        let base = |t: Option<&str>, s: Option<&str>| {
            EdgeConfig::from_bindings(
                Some("https://x".into()),
                t.map(String::from),
                None,
                s.map(String::from),
            )
        };
        assert_eq!(
            base(None, Some("0123456789abcdef")).map(|c| c.timeout_ms),
            Ok(DEFAULT_TIMEOUT_MS)
        );
        assert_eq!(
            base(Some("250"), Some("0123456789abcdef")).map(|c| c.timeout_ms),
            Ok(250)
        );
        assert!(base(Some("0"), Some("0123456789abcdef")).is_err());
        assert!(base(Some("soon"), Some("0123456789abcdef")).is_err());
        let e = base(None, Some("tiny-secret")).expect_err("short secret");
        assert!(
            !e.body().error.message.contains("tiny-secret"),
            "never echo the value"
        );
        assert!(base(None, None).is_err());
    }
}

//! Who may do what at the public edge. Anyone on the Internet may read items; writes and the
//! cache routes need `Authorization: Bearer <FERRY_API_KEY>` (set with `wrangler secret put
//! FERRY_API_KEY`). Without a configured key those routes are refused for everyone: the safe
//! default for a Worker deployed as it is.

use crate::error::EdgeError;
use ferry_shared::sign::body_digest;

/// Shortest API key accepted; a shorter configured key counts as none.
pub const MIN_API_KEY_LEN: usize = 16;

/// Checks the request's `Authorization` header against the configured key.
pub fn require_api_key(
    authorization: Option<&str>,
    configured: Option<&str>,
) -> Result<(), EdgeError> {
    let Some(key) = configured.filter(|k| k.len() >= MIN_API_KEY_LEN) else {
        return Err(EdgeError::Unauthorized(format!(
            "this route needs an API key, and this Worker has none configured \
             (wrangler secret put {})",
            crate::config::API_KEY
        )));
    };
    let given = authorization
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or_default();
    if equal_in_constant_time(given, key) {
        Ok(())
    } else {
        Err(EdgeError::Unauthorized(
            "this route needs Authorization: Bearer <API key>".into(),
        ))
    }
}

/// Compares the SHA-256 digests of both strings byte by byte without an early exit, so the
/// time taken reveals neither the key's length nor how much of it matched.
fn equal_in_constant_time(a: &str, b: &str) -> bool {
    let (x, y) = (body_digest(a.as_bytes()), body_digest(b.as_bytes()));
    x.bytes()
        .zip(y.bytes())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "edge-api-key-0123456789";

    #[test]
    fn only_the_configured_key_passes() {
        let bearer = format!("Bearer {KEY}");
        assert!(require_api_key(Some(&bearer), Some(KEY)).is_ok());
        for bad in [
            None,
            Some(""),
            Some("Bearer "),
            Some("Bearer nope"),
            Some(KEY),
        ] {
            let e = require_api_key(bad, Some(KEY)).expect_err("refused");
            assert_eq!(e.status(), 401);
            assert!(!e.body().error.message.contains(KEY), "never echo the key");
        }
        let longer = format!("Bearer {KEY}x");
        assert!(require_api_key(Some(&longer), Some(KEY)).is_err());
    }

    #[test]
    fn without_a_configured_key_nobody_passes() {
        let bearer = format!("Bearer {KEY}");
        for configured in [None, Some(""), Some("short")] {
            let e = require_api_key(Some(&bearer), configured).expect_err("refused");
            assert_eq!(e.code().as_str(), "unauthorized");
            assert!(e.body().error.message.contains("FERRY_API_KEY"));
        }
    }
}

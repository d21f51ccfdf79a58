//! Who may do what at the public edge. Anyone on the Internet may read items; writes and the
//! cache routes need `Authorization: Bearer <FERRY_API_KEY>` (set with `wrangler secret put
//! FERRY_API_KEY`). Without a configured key those routes are refused for everyone: the safe
//! default for a Worker deployed as it is.

use crate::error::EdgeError;
use crate::jwt::{self, Rules};
use ferry_shared::api::Identity;

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
    let given = ferry_shared::token::bearer(authorization).unwrap_or_default();
    if ferry_shared::token::same(given, key) {
        Ok(())
    } else {
        Err(EdgeError::Unauthorized(
            "this route needs Authorization: Bearer <API key>".into(),
        ))
    }
}

/// The end user of a per-user route, from `Authorization: Bearer <JWT>` verified with the
/// configured key: the identity the sidecar runs their statements as. Without a configured key
/// (`FERRY_JWT_SECRET`, 32 bytes or more) every caller is refused.
pub fn end_user(
    authorization: Option<&str>,
    jwt_secret: Option<&str>,
    rules: &Rules,
    now_s: u64,
) -> Result<Identity, EdgeError> {
    let Some(secret) = jwt_secret.filter(|k| k.len() >= jwt::MIN_SECRET_LEN) else {
        return Err(EdgeError::Unauthorized(format!(
            "this route needs a signed-in user, and this Worker has no JWT key configured \
             (wrangler secret put {})",
            crate::config::JWT_SECRET
        )));
    };
    let token = jwt::bearer(authorization).map_err(|e| EdgeError::Unauthorized(e.message()))?;
    jwt::verify_hs256(token, secret.as_bytes(), rules, now_s)
        .map(jwt::identity)
        .map_err(|e| EdgeError::Unauthorized(e.message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "edge-api-key-0123456789";

    #[test]
    fn end_users_need_a_verified_token_and_a_configured_key() {
        let jwt_key = "0123456789abcdef0123456789abcdef";
        let now = 1_800_000_000;
        let t = crate::jwt::sign_hs256(
            &serde_json::json!({"sub": "a", "exp": now + 60}),
            jwt_key.as_bytes(),
        );
        let header = format!("Bearer {t}");
        let rules = Rules::default();
        let who = end_user(Some(&header), Some(jwt_key), &rules, now).expect("valid");
        assert_eq!(
            (who.role.as_str(), who.claims["sub"].as_str()),
            ("authenticated", Some("a"))
        );
        // No key, or one too short to be a real HS256 key: nobody gets in.
        for key in [None, Some("short")] {
            let e = end_user(Some(&header), key, &rules, now).expect_err("refused");
            assert_eq!(e.status(), 401);
        }
        let e = end_user(Some(&header), Some(jwt_key), &rules, now + 3600).expect_err("expired");
        assert_eq!(
            (e.status(), e.body().error.message.as_str()),
            (401, "token expired")
        );
        assert_eq!(
            end_user(None, Some(jwt_key), &rules, now).map_err(|e| e.status()),
            Err(401)
        );
    }

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

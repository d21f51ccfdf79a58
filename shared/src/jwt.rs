//! The end user's JWT (RFC 7519), turned into the identity the sidecar runs their statements
//! as: verified at the edge for its routes, and at the sidecar for the Neon driver's
//! `authToken`. HS256 here, with a shared secret; RS256 and ES256 against the provider's JWKS
//! (`jwks` chooses the key; the signature is checked by WebCrypto at the edge and by the
//! sidecar's own crypto).
//!
//! Strict by design: an algorithm only with its own kind of key (no `none`; an HS256 token is
//! never checked with a public key, nor RS256 with the secret), no `crit` extensions, an `exp` required, `nbf`, `aud` and `iss` checked when
//! present or configured. The MAC is compared in constant time. Nothing here trusts the token
//! before its signature has checked out, except its length and header.

use crate::api::Identity;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

/// Longer tokens are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;
/// The shortest HS256 secret accepted: 256 bits, as RFC 7518 §3.2 requires.
pub const MIN_SECRET_LEN: usize = 32;
/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const LEEWAY_S: u64 = 30;
/// The role a token without a `role` claim runs as (Supabase's and PostgREST's convention).
pub const DEFAULT_ROLE: &str = "authenticated";

/// What a token must also satisfy (the Worker's bindings, the sidecar's `[identity]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// `FERRY_JWT_AUDIENCE`: when set, `aud` must be (or contain) it.
    pub audience: Option<String>,
    /// `FERRY_JWT_ISSUER`: when set, `iss` must equal it.
    pub issuer: Option<String>,
}

/// Why a token was refused. The message says what is wrong, never what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    /// No bearer token.
    Missing,
    /// Not a well-formed JWT; what is wrong.
    Malformed(&'static str),
    /// An algorithm this Worker does not accept for it.
    Algorithm,
    /// The signature does not match.
    BadSignature,
    /// Past `exp`.
    Expired,
    /// Before `nbf`.
    NotYetValid,
    /// Not for this audience.
    Audience,
    /// Not from this issuer.
    Issuer,
    /// No key of the JWKS fits the token's `kid` and `alg`.
    UnknownKey,
    /// The JWKS could not be fetched or read.
    KeysUnavailable,
}

impl JwtError {
    /// A message safe to show the caller.
    pub fn message(&self) -> String {
        match self {
            JwtError::Missing => "this route needs Authorization: Bearer <JWT>".into(),
            JwtError::Malformed(what) => format!("malformed token: {what}"),
            JwtError::Algorithm => "token algorithm not accepted".into(),
            JwtError::BadSignature => "token signature does not match".into(),
            JwtError::Expired => "token expired".into(),
            JwtError::NotYetValid => "token not valid yet (nbf)".into(),
            JwtError::Audience => "token audience not accepted".into(),
            JwtError::Issuer => "token issuer not accepted".into(),
            JwtError::UnknownKey => "token signed with a key that is not known here".into(),
            JwtError::KeysUnavailable => "the signing keys could not be fetched; retry".into(),
        }
    }
}

/// The bearer token of an `Authorization` header.
pub fn bearer(authorization: Option<&str>) -> Result<&str, JwtError> {
    crate::token::bearer(authorization).ok_or(JwtError::Missing)
}

/// A token split, its header read and its signature decoded: nothing in it is trusted yet.
pub struct Parsed<'a> {
    /// The header's `alg`.
    pub alg: String,
    /// The header's `kid`, naming the key in a JWKS.
    pub kid: Option<String>,
    /// What the signature covers: `header.payload`, as sent.
    pub signing_input: &'a str,
    /// The signature, decoded.
    pub signature: Vec<u8>,
    payload: &'a str,
}

/// Splits a compact JWS and reads its header: three base64url parts, a JSON object header
/// with a string `alg` and no `crit`.
pub fn parse(token: &str) -> Result<Parsed<'_>, JwtError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(JwtError::Malformed("too long"));
    }
    let (Some((signing_input, s64)), true) =
        (token.rsplit_once('.'), token.matches('.').count() == 2)
    else {
        return Err(JwtError::Malformed("not three dot-separated parts"));
    };
    let Some((h64, payload)) = signing_input.split_once('.') else {
        return Err(JwtError::Malformed("not three dot-separated parts"));
    };
    let header = object(h64, "header")?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(JwtError::Algorithm)?
        .to_string();
    if header.contains_key("crit") {
        return Err(JwtError::Malformed("crit extensions are not supported"));
    }
    let signature = URL_SAFE_NO_PAD
        .decode(s64)
        .map_err(|_| JwtError::Malformed("signature is not base64url"))?;
    Ok(Parsed {
        alg,
        kid: header
            .get("kid")
            .and_then(Value::as_str)
            .map(str::to_string),
        signing_input,
        signature,
        payload,
    })
}

impl Parsed<'_> {
    /// The claims, checked against the clock and `rules`. Call only once the signature has
    /// been verified.
    pub fn verified_claims(
        &self,
        rules: &Rules,
        now_s: u64,
    ) -> Result<Map<String, Value>, JwtError> {
        let claims = object(self.payload, "payload")?;
        check_claims(&claims, rules, now_s)?;
        Ok(claims)
    }
}

/// Verifies `token` with `secret` at `now_s` (Unix seconds) and returns its claims.
///
/// ```
/// use ferry_shared::jwt::{sign_hs256, verify_hs256, JwtError, Rules};
/// let key = b"0123456789abcdef0123456789abcdef";
/// let token = sign_hs256(&serde_json::json!({"sub": "alice", "exp": 2_000_000_000}), key);
/// let claims = verify_hs256(&token, key, &Rules::default(), 1_900_000_000).unwrap();
/// assert_eq!(claims["sub"], "alice");
/// let other = b"another key of 32 bytes or more!";
/// assert_eq!(
///     verify_hs256(&token, other, &Rules::default(), 1_900_000_000),
///     Err(JwtError::BadSignature)
/// );
/// ```
pub fn verify_hs256(
    token: &str,
    secret: &[u8],
    rules: &Rules,
    now_s: u64,
) -> Result<Map<String, Value>, JwtError> {
    let p = parse(token)?;
    if p.alg != "HS256" {
        return Err(JwtError::Algorithm);
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| JwtError::BadSignature)?;
    mac.update(p.signing_input.as_bytes());
    mac.verify_slice(&p.signature)
        .map_err(|_| JwtError::BadSignature)?;
    p.verified_claims(rules, now_s)
}

fn check_claims(claims: &Map<String, Value>, rules: &Rules, now_s: u64) -> Result<(), JwtError> {
    let time = |name: &str| claims.get(name).map(|v| v.as_u64());
    match time("exp") {
        Some(Some(exp)) if now_s <= exp.saturating_add(LEEWAY_S) => {}
        Some(Some(_)) => return Err(JwtError::Expired),
        Some(None) => return Err(JwtError::Malformed("exp is not a number of seconds")),
        None => return Err(JwtError::Malformed("exp is required")),
    }
    match time("nbf") {
        Some(Some(nbf)) if now_s.saturating_add(LEEWAY_S) < nbf => {
            return Err(JwtError::NotYetValid)
        }
        Some(None) => return Err(JwtError::Malformed("nbf is not a number of seconds")),
        _ => {}
    }
    // A role that is not a string would quietly run as the default one.
    if claims.get("role").is_some_and(|r| !r.is_string()) {
        return Err(JwtError::Malformed("role is not a string"));
    }
    if let Some(want) = &rules.audience {
        let ok = match claims.get("aud") {
            Some(Value::String(a)) => a == want,
            Some(Value::Array(all)) => all.iter().any(|a| a.as_str() == Some(want)),
            _ => false,
        };
        if !ok {
            return Err(JwtError::Audience);
        }
    }
    if let Some(want) = &rules.issuer {
        if claims.get("iss").and_then(Value::as_str) != Some(want.as_str()) {
            return Err(JwtError::Issuer);
        }
    }
    Ok(())
}

/// The identity a verified token's claims run as: its `role` claim, or `authenticated`. The
/// sidecar accepts only the roles its `identity.roles` names.
pub fn identity(claims: Map<String, Value>) -> Identity {
    let role = claims
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_ROLE)
        .to_string();
    Identity { role, claims }
}

fn object(part: &str, what: &'static str) -> Result<Map<String, Value>, JwtError> {
    let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|_| {
        JwtError::Malformed(if what == "header" {
            "header is not base64url"
        } else {
            "payload is not base64url"
        })
    })?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(JwtError::Malformed(if what == "header" {
            "header is not a JSON object"
        } else {
            "payload is not a JSON object"
        })),
    }
}

/// Signs claims as an HS256 JWT: for tests and the dev command's demo tokens.
pub fn sign_hs256(claims: &Value, secret: &[u8]) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(format!("{header}.{payload}").as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{header}.{payload}.{sig}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_800_000_000;

    fn ok(claims: Value) -> Result<Map<String, Value>, JwtError> {
        verify_hs256(&sign_hs256(&claims, KEY), KEY, &Rules::default(), NOW)
    }

    #[test]
    fn a_good_token_gives_its_claims_and_role() {
        let c = ok(json!({"sub": "alice", "exp": NOW + 60})).expect("valid");
        assert_eq!(c["sub"], "alice");
        assert_eq!(identity(c).role, "authenticated");
        let c = ok(json!({"sub": "a", "exp": NOW + 60, "role": "anon"})).expect("valid");
        assert_eq!(identity(c).role, "anon");
        for role in [json!(5), json!(null), json!(["postgres"])] {
            assert!(
                matches!(
                    ok(json!({"exp": NOW + 60, "role": role})),
                    Err(JwtError::Malformed(_))
                ),
                "{role}"
            );
        }
    }

    #[test]
    fn time_claims() {
        assert_eq!(ok(json!({"exp": NOW - 31})), Err(JwtError::Expired));
        assert!(ok(json!({"exp": NOW - 29})).is_ok(), "within the leeway");
        assert!(matches!(
            ok(json!({"sub": "x"})),
            Err(JwtError::Malformed(_))
        ));
        assert!(matches!(
            ok(json!({"exp": "soon"})),
            Err(JwtError::Malformed(_))
        ));
        assert_eq!(
            ok(json!({"exp": NOW + 600, "nbf": NOW + 300})),
            Err(JwtError::NotYetValid)
        );
    }

    #[test]
    fn forged_and_confused_tokens_are_refused() {
        let good = sign_hs256(&json!({"sub": "alice", "exp": NOW + 60}), KEY);
        let rules = Rules::default();
        // Another key.
        let other = sign_hs256(&json!({"sub": "alice", "exp": NOW + 60}), &[b'x'; 32]);
        assert_eq!(
            verify_hs256(&other, KEY, &rules, NOW),
            Err(JwtError::BadSignature)
        );
        // A payload swapped under the old signature.
        let parts: Vec<&str> = good.split('.').collect();
        let evil = URL_SAFE_NO_PAD.encode(json!({"sub": "bob", "exp": NOW + 60}).to_string());
        let swapped = format!("{}.{evil}.{}", parts[0], parts[2]);
        assert_eq!(
            verify_hs256(&swapped, KEY, &rules, NOW),
            Err(JwtError::BadSignature)
        );
        // alg: none (no signature), and other algorithms.
        for alg in ["none", "None", "HS512", "RS256", "hs256"] {
            let h = URL_SAFE_NO_PAD.encode(json!({"alg": alg}).to_string());
            let t = format!("{h}.{}.", parts[1]);
            assert_eq!(
                verify_hs256(&t, KEY, &rules, NOW),
                Err(JwtError::Algorithm),
                "{alg}"
            );
        }
        let crit = URL_SAFE_NO_PAD.encode(json!({"alg": "HS256", "crit": ["x"]}).to_string());
        assert!(matches!(
            verify_hs256(
                &format!("{crit}.{}.{}", parts[1], parts[2]),
                KEY,
                &rules,
                NOW
            ),
            Err(JwtError::Malformed(_))
        ));
        for bad in [
            "",
            "a.b",
            "a.b.c.d",
            "!!.!!.!!",
            &"a".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert!(
                matches!(
                    verify_hs256(bad, KEY, &rules, NOW),
                    Err(JwtError::Malformed(_) | JwtError::Algorithm)
                ),
                "{bad:.20}"
            );
        }
    }

    #[test]
    fn audience_and_issuer() {
        let rules = Rules {
            audience: Some("app".into()),
            issuer: Some("https://auth.example".into()),
        };
        let t = |c: Value| verify_hs256(&sign_hs256(&c, KEY), KEY, &rules, NOW);
        let exp = NOW + 60;
        assert!(t(json!({"exp": exp, "aud": "app", "iss": "https://auth.example"})).is_ok());
        assert!(t(json!({"exp": exp, "aud": ["x", "app"], "iss": "https://auth.example"})).is_ok());
        assert_eq!(
            t(json!({"exp": exp, "aud": "other", "iss": "https://auth.example"})),
            Err(JwtError::Audience)
        );
        assert_eq!(t(json!({"exp": exp, "aud": "app"})), Err(JwtError::Issuer));
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some("Basic abc")), Err(JwtError::Missing));
        assert_eq!(bearer(Some("Bearer  ")), Err(JwtError::Missing));
        assert_eq!(bearer(None), Err(JwtError::Missing));
    }
}

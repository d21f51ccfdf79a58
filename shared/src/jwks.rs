//! An auth provider's published keys (a JWKS, RFC 7517) and which one may verify a token.
//!
//! A key is chosen by the token's `kid` and must be of the kind its `alg` needs: RS256 only
//! with an RSA key, ES256 only with a P-256 key, never the other way, and HS256 never here (it
//! is checked with a shared secret). The chosen key is reduced to its public parameters, which
//! is all a verifier needs: WebCrypto in the Worker (`ferry::user`), the sidecar's own crypto
//! for the Neon door (`http::end_user`).

use crate::jwt::JwtError;
use serde_json::{Map, Value};

/// The algorithms verified against a JWKS.
pub const ASYMMETRIC: [&str; 2] = ["RS256", "ES256"];
/// Largest JWKS document read, in bytes.
pub const MAX_JWKS_BYTES: usize = 64 * 1024;

/// A fetched key set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeySet {
    keys: Vec<Map<String, Value>>,
}

impl KeySet {
    /// Reads a JWKS document (`{"keys": [...]}`).
    pub fn parse(body: &[u8]) -> Result<KeySet, JwtError> {
        if body.len() > MAX_JWKS_BYTES {
            return Err(JwtError::KeysUnavailable);
        }
        let doc: Value = serde_json::from_slice(body).map_err(|_| JwtError::KeysUnavailable)?;
        let keys = doc
            .get("keys")
            .and_then(Value::as_array)
            .ok_or(JwtError::KeysUnavailable)?
            .iter()
            .filter_map(|k| k.as_object().cloned())
            .collect();
        Ok(KeySet { keys })
    }

    /// The public parameters of the key that may verify a token with this `alg` and `kid`:
    /// `{kty, n, e}` for RS256, `{kty, crv, x, y}` for ES256. A token without a `kid` is
    /// accepted only when exactly one key fits.
    pub fn find(&self, alg: &str, kid: Option<&str>) -> Result<Map<String, Value>, JwtError> {
        let (kty, fields): (&str, &[&str]) = match alg {
            "RS256" => ("RSA", &["n", "e"]),
            "ES256" => ("EC", &["crv", "x", "y"]),
            _ => return Err(JwtError::Algorithm),
        };
        let s =
            |k: &Map<String, Value>, f: &str| k.get(f).and_then(Value::as_str).map(str::to_string);
        let fits = |k: &&Map<String, Value>| {
            s(k, "kty").as_deref() == Some(kty)
                && (alg != "ES256" || s(k, "crv").as_deref() == Some("P-256"))
                && s(k, "alg").is_none_or(|a| a == alg)
                && s(k, "use").is_none_or(|u| u == "sig")
                && kid.is_none_or(|want| s(k, "kid").as_deref() == Some(want))
                && fields.iter().all(|f| s(k, f).is_some())
        };
        let mut matching = self.keys.iter().filter(fits);
        let (Some(key), None) = (matching.next(), matching.next()) else {
            return Err(JwtError::UnknownKey);
        };
        let mut public = Map::new();
        public.insert("kty".into(), Value::String(kty.into()));
        for f in fields {
            public.insert((*f).into(), key[*f].clone());
        }
        Ok(public)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set() -> KeySet {
        KeySet::parse(
            json!({"keys": [
                {"kty": "RSA", "kid": "r1", "n": "AQAB-n", "e": "AQAB", "alg": "RS256", "use": "sig",
                 "d": "PRIVATE-must-not-travel"},
                {"kty": "EC", "kid": "e1", "crv": "P-256", "x": "xx", "y": "yy"},
                {"kty": "EC", "kid": "e2", "crv": "P-384", "x": "xx", "y": "yy"},
                {"kty": "oct", "kid": "h1", "k": "c2VjcmV0"},
                {"kty": "RSA", "kid": "enc", "n": "n", "e": "AQAB", "use": "enc"}
            ]})
            .to_string()
            .as_bytes(),
        )
        .expect("parses")
    }

    #[test]
    fn each_alg_gets_only_its_kind_of_key() {
        let k = set();
        let rsa = k.find("RS256", Some("r1")).expect("rsa");
        assert_eq!(
            rsa,
            json!({"kty": "RSA", "n": "AQAB-n", "e": "AQAB"})
                .as_object()
                .cloned()
                .unwrap()
        );
        assert_eq!(k.find("ES256", Some("e1")).expect("ec")["crv"], "P-256");
        // Confusions: an EC kid for RS256, an RSA kid for ES256, a P-384 key, a symmetric key,
        // an encryption key, HS256 or none through the JWKS.
        for (alg, kid) in [
            ("RS256", "e1"),
            ("ES256", "r1"),
            ("ES256", "e2"),
            ("RS256", "h1"),
            ("RS256", "enc"),
            ("RS256", "nope"),
        ] {
            assert_eq!(
                k.find(alg, Some(kid)),
                Err(JwtError::UnknownKey),
                "{alg} {kid}"
            );
        }
        for alg in ["HS256", "none", "RS512"] {
            assert_eq!(k.find(alg, Some("r1")), Err(JwtError::Algorithm), "{alg}");
        }
        // No kid: only when one key fits.
        assert!(k.find("ES256", None).is_ok());
        let two = KeySet::parse(br#"{"keys":[{"kty":"EC","crv":"P-256","x":"a","y":"b"},{"kty":"EC","crv":"P-256","x":"c","y":"d"}]}"#).expect("parses");
        assert_eq!(two.find("ES256", None), Err(JwtError::UnknownKey));
        assert_eq!(KeySet::parse(b"<html>"), Err(JwtError::KeysUnavailable));
    }
}

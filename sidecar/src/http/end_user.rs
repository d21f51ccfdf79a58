//! End users' JWTs checked by the sidecar itself: the Neon driver's `authToken`, which it sends
//! to `/sql` as `Authorization: Bearer <JWT>`. The rules are the edge's (`ferry_shared::jwt`:
//! HS256 with `identity.jwt_secret`, RS256 and ES256 against the provider's JWKS at
//! `identity.jwks_url`, `exp` required, `aud` and `iss` when configured); the signature is
//! checked here with ring. A verified token becomes the request's identity, as a signed
//! request's does on `/v1`.

use crate::config::Config;
use crate::error::ApiError;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ferry_shared::api::Identity;
use ferry_shared::jwks::{KeySet, ASYMMETRIC, MAX_JWKS_BYTES};
use ferry_shared::jwt::{self, JwtError, Parsed, Rules};
use serde_json::{Map, Value};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Mutex;

/// A key set asked again for an unknown `kid` at most this often.
const REFETCH_AFTER: Duration = Duration::from_secs(30);
/// How long a JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The provider's keys, as last fetched, and when a fetch was last tried (a failed one too:
/// made-up `kid`s, or a provider that is down, cause one fetch per `REFETCH_AFTER`, not one
/// per request).
#[derive(Default)]
pub(crate) struct EndUsers {
    keys: Mutex<Option<Fetched>>,
    tried: Mutex<Option<(String, Instant)>>,
}

struct Fetched {
    url: String,
    keys: KeySet,
    at: Instant,
}

impl EndUsers {
    /// The identity of the request's bearer token; None without an `Authorization` header.
    /// A token that does not check out is refused (401 `unauthorized`, saying why).
    pub(crate) async fn identity(
        &self,
        authorization: Option<&str>,
        config: &Config,
    ) -> Result<Option<Identity>, ApiError> {
        let Some(header) = authorization else {
            return Ok(None);
        };
        let refused = |e: JwtError| ApiError::EndUser {
            message: e.message(),
        };
        let c = &config.identity;
        let rules = Rules {
            audience: (!c.jwt_audience.is_empty()).then(|| c.jwt_audience.clone()),
            issuer: (!c.jwt_issuer.is_empty()).then(|| c.jwt_issuer.clone()),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let token = jwt::bearer(Some(header)).map_err(refused)?;
        let parsed = jwt::parse(token).map_err(refused)?;
        let none_configured = || ApiError::EndUser {
            message: "no end user's token is accepted here (the sidecar has neither \
                      identity.jwt_secret nor identity.jwks_url)"
                .into(),
        };
        if c.jwt_secret.is_empty() && c.jwks_url.is_empty() {
            return Err(none_configured());
        }
        if !ASYMMETRIC.contains(&parsed.alg.as_str()) {
            if c.jwt_secret.is_empty() {
                return Err(refused(JwtError::Algorithm));
            }
            return jwt::verify_hs256(token, c.jwt_secret.as_bytes(), &rules, now)
                .map(|claims| Some(jwt::identity(claims)))
                .map_err(refused);
        }
        if c.jwks_url.is_empty() {
            return Err(refused(JwtError::Algorithm));
        }
        let ttl = Duration::from_secs(c.jwks_ttl_s);
        let key = match self.key_for(&c.jwks_url, &parsed, ttl, false).await {
            Err(JwtError::UnknownKey) => self.key_for(&c.jwks_url, &parsed, ttl, true).await,
            other => other,
        }
        .map_err(refused)?;
        if !verify(&parsed, &key) {
            return Err(refused(JwtError::BadSignature));
        }
        parsed
            .verified_claims(&rules, now)
            .map(|claims| Some(jwt::identity(claims)))
            .map_err(refused)
    }

    /// The key for this token from the cached set, fetched when there is none, when it is older
    /// than `ttl`, or (`again`) when the token names a key the set lacks and the last fetch is
    /// not too recent.
    async fn key_for(
        &self,
        url: &str,
        parsed: &Parsed<'_>,
        ttl: Duration,
        again: bool,
    ) -> Result<Map<String, Value>, JwtError> {
        let mut cached = self.keys.lock().await;
        let fresh = cached.as_ref().is_some_and(|f| {
            f.url == url && f.at.elapsed() < ttl && !(again && f.at.elapsed() >= REFETCH_AFTER)
        });
        let tried_lately = {
            let mut tried = self.tried.lock().await;
            let lately = tried
                .as_ref()
                .is_some_and(|(u, at)| u == url && at.elapsed() < REFETCH_AFTER);
            if !fresh && !lately {
                *tried = Some((url.to_string(), Instant::now()));
            }
            lately
        };
        if !fresh && !tried_lately {
            match fetch(url).await {
                Ok(keys) => {
                    *cached = Some(Fetched {
                        url: url.to_string(),
                        keys,
                        at: Instant::now(),
                    })
                }
                Err(e) => {
                    tracing::warn!(url, error = %e, "identity.jwks_url could not be fetched");
                    // A set fetched before still answers for the keys it holds.
                    if cached.as_ref().is_none_or(|f| f.url != url) {
                        return Err(JwtError::KeysUnavailable);
                    }
                }
            }
        }
        let set = cached.as_ref().ok_or(JwtError::KeysUnavailable)?;
        set.keys.find(&parsed.alg, parsed.kid.as_deref())
    }
}

/// The client that fetches key sets: the system's trust roots, read once (reqwest is built
/// with manual roots, so no other client of the process pays for reading them).
fn client() -> Result<&'static reqwest::Client, String> {
    static CLIENT: std::sync::OnceLock<Result<reqwest::Client, String>> =
        std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let mut b = reqwest::Client::builder()
                .timeout(FETCH_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none());
            for cert in rustls_native_certs::load_native_certs().certs {
                if let Ok(c) = reqwest::Certificate::from_der(&cert) {
                    b = b.add_root_certificate(c);
                }
            }
            b.build().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

async fn fetch(url: &str) -> Result<KeySet, String> {
    let mut resp = client()?.get(url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_JWKS_BYTES {
            return Err(format!("larger than {MAX_JWKS_BYTES} bytes"));
        }
    }
    KeySet::parse(&body).map_err(|e| e.message())
}

/// The token's signature checked with the key's public parameters.
fn verify(parsed: &Parsed<'_>, key: &Map<String, Value>) -> bool {
    use ring::signature;
    let part = |name: &str| {
        key.get(name)
            .and_then(Value::as_str)
            .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
    };
    let message = parsed.signing_input.as_bytes();
    match parsed.alg.as_str() {
        "RS256" => {
            let (Some(n), Some(e)) = (part("n"), part("e")) else {
                return false;
            };
            signature::RsaPublicKeyComponents { n: &n, e: &e }
                .verify(
                    &signature::RSA_PKCS1_2048_8192_SHA256,
                    message,
                    &parsed.signature,
                )
                .is_ok()
        }
        "ES256" => {
            let (Some(x), Some(y)) = (part("x"), part("y")) else {
                return false;
            };
            if x.len() != 32 || y.len() != 32 {
                return false;
            }
            let mut point = vec![4u8];
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, &parsed.signature)
                .is_ok()
        }
        _ => false,
    }
}

//! The end user of a request (wasm32): the bearer JWT, verified, as the `Identity` the sidecar
//! runs their statements as. HS256 with the Worker's `FERRY_JWT_SECRET`; RS256 and ES256
//! against the provider's keys at `FERRY_JWKS_URL`, verified with WebCrypto.
//!
//! The keys are kept in the isolate for [`KEYS_TTL_S`]. A token whose `kid` is not among them
//! fetches them again (a provider's rotation is seen on its first new token), at most once per
//! [`REFETCH_MIN_S`], so made-up `kid`s cannot turn into a flood of fetches.

use crate::config;
use crate::error::EdgeError;
use crate::jwks::{KeySet, ASYMMETRIC, MAX_JWKS_BYTES};
use crate::jwt::{self, JwtError, Parsed, Rules};
use ferry_shared::api::Identity;
use futures_util::future::{select, Either};
use js_sys::{Array, Function, Promise, Reflect, Uint8Array, JSON};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use worker::{Date, Delay, Env, Fetch, Request, Url};

/// How long fetched keys are used, in seconds.
pub const KEYS_TTL_S: u64 = 600;
/// The least time between two fetches of the keys, in seconds.
pub const REFETCH_MIN_S: u64 = 10;
/// How long a fetch of the keys may take, in milliseconds.
const FETCH_TIMEOUT_MS: u64 = 3_000;

struct Cached {
    url: String,
    fetched_s: u64,
    keys: Rc<KeySet>,
}

thread_local! {
    static KEYS: RefCell<Option<Cached>> = const { RefCell::new(None) };
}

fn refused(e: JwtError) -> EdgeError {
    match e {
        JwtError::KeysUnavailable => EdgeError::KeysUnavailable,
        other => EdgeError::Unauthorized(other.message()),
    }
}

/// The signed-in user of `req`, from `Authorization: Bearer <JWT>`: 401 `unauthorized` for a
/// missing, malformed, forged, expired or foreign token; 502 when the provider's keys cannot
/// be fetched.
pub async fn end_user(req: &Request, env: &Env) -> Result<Identity, EdgeError> {
    let var = |name: &str| {
        env.var(name)
            .ok()
            .map(|v| v.to_string())
            .filter(|v| !v.is_empty())
    };
    let rules = Rules {
        audience: var(config::VAR_JWT_AUDIENCE),
        issuer: var(config::VAR_JWT_ISSUER),
    };
    let auth = req.headers().get("authorization").ok().flatten();
    let now = Date::now().as_millis() / 1000;
    let token = jwt::bearer(auth.as_deref()).map_err(refused)?;
    let parsed = jwt::parse(token).map_err(refused)?;
    if !ASYMMETRIC.contains(&parsed.alg.as_str()) {
        let secret = env.secret(config::JWT_SECRET).ok().map(|s| s.to_string());
        return crate::access::end_user(auth.as_deref(), secret.as_deref(), &rules, now);
    }
    let Some(url) = config::jwks_url(var(config::VAR_JWKS_URL), var(config::VAR_ALLOW_HTTP))?
    else {
        // No key set configured: an RS256/ES256 token cannot be checked here.
        return Err(refused(JwtError::Algorithm));
    };
    let key = match key_for(&url, &parsed, now, false).await {
        Err(JwtError::UnknownKey) => key_for(&url, &parsed, now, true).await,
        other => other,
    }
    .map_err(refused)?;
    if !verify(&parsed, &key).await {
        return Err(refused(JwtError::BadSignature));
    }
    parsed
        .verified_claims(&rules, now)
        .map(jwt::identity)
        .map_err(refused)
}

/// The key for this token from the cached set, fetching the set when there is none, when it is
/// old, or (`again`) when the token names a key the set lacks and the last fetch is not too
/// recent.
async fn key_for(
    url: &str,
    parsed: &Parsed<'_>,
    now: u64,
    again: bool,
) -> Result<Map<String, Value>, JwtError> {
    let cached = KEYS.with(|k| {
        k.borrow().as_ref().and_then(|c| {
            let age = now.saturating_sub(c.fetched_s);
            let usable = c.url == url && age < KEYS_TTL_S && !(again && age >= REFETCH_MIN_S);
            usable.then(|| c.keys.clone())
        })
    });
    let keys = match cached {
        Some(keys) => keys,
        None => {
            let keys = Rc::new(fetch(url).await?);
            KEYS.with(|k| {
                *k.borrow_mut() = Some(Cached {
                    url: url.to_string(),
                    fetched_s: now,
                    keys: keys.clone(),
                })
            });
            keys
        }
    };
    keys.find(&parsed.alg, parsed.kid.as_deref())
}

async fn fetch(url: &str) -> Result<KeySet, JwtError> {
    let url = Url::parse(url).map_err(|_| JwtError::KeysUnavailable)?;
    let get = async move {
        let mut resp = Fetch::Url(url)
            .send()
            .await
            .map_err(|_| JwtError::KeysUnavailable)?;
        if resp.status_code() != 200 {
            return Err(JwtError::KeysUnavailable);
        }
        let body = resp.bytes().await.map_err(|_| JwtError::KeysUnavailable)?;
        if body.len() > MAX_JWKS_BYTES {
            return Err(JwtError::KeysUnavailable);
        }
        KeySet::parse(&body)
    };
    let timer = Delay::from(Duration::from_millis(FETCH_TIMEOUT_MS));
    match select(Box::pin(get), timer).await {
        Either::Left((keys, _)) => keys,
        Either::Right(_) => Err(JwtError::KeysUnavailable),
    }
}

/// WebCrypto's verdict on the token's signature with `key` (public parameters only). Any
/// failure along the way (a key WebCrypto refuses, a malformed signature) is a refusal.
async fn verify(parsed: &Parsed<'_>, key: &Map<String, Value>) -> bool {
    verify_js(parsed, key).await.unwrap_or(false)
}

async fn verify_js(parsed: &Parsed<'_>, key: &Map<String, Value>) -> Result<bool, JsValue> {
    let (import_alg, verify_alg) = match parsed.alg.as_str() {
        "RS256" => (
            r#"{"name":"RSASSA-PKCS1-v1_5","hash":"SHA-256"}"#,
            r#"{"name":"RSASSA-PKCS1-v1_5"}"#,
        ),
        "ES256" => (
            r#"{"name":"ECDSA","namedCurve":"P-256"}"#,
            r#"{"name":"ECDSA","hash":"SHA-256"}"#,
        ),
        _ => return Ok(false),
    };
    let subtle = Reflect::get(
        &Reflect::get(&js_sys::global(), &"crypto".into())?,
        &"subtle".into(),
    )?;
    let call = |name: &str, args: &[JsValue]| -> Result<JsFuture, JsValue> {
        let f: Function = Reflect::get(&subtle, &name.into())?.dyn_into()?;
        let args: Array = args.iter().collect();
        let p: Promise = f.apply(&subtle, &args)?.dyn_into()?;
        Ok(JsFuture::from(p))
    };
    let jwk = JSON::parse(&Value::Object(key.clone()).to_string())?;
    let usages: Array = [JsValue::from("verify")].iter().collect();
    let imported = call(
        "importKey",
        &[
            "jwk".into(),
            jwk,
            JSON::parse(import_alg)?,
            false.into(),
            usages.into(),
        ],
    )?
    .await?;
    let ok = call(
        "verify",
        &[
            JSON::parse(verify_alg)?,
            imported,
            Uint8Array::from(parsed.signature.as_slice()).into(),
            Uint8Array::from(parsed.signing_input.as_bytes()).into(),
        ],
    )?
    .await?;
    Ok(ok.as_bool() == Some(true))
}

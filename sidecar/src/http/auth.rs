//! Request authentication: every `/v1` request is signed (see `ferry_shared::sign`), fresh and
//! never seen before. Runs before the body is parsed and before any Redis or Postgres work.

use crate::error::ApiError;
use crate::http::replay::NonceStore;
use crate::store::coordination::nonces::seen::Seen;
use actix_web::http::header::HeaderName;
use actix_web::{web, HttpRequest};
use bytes::{Bytes, BytesMut};
use ferry_shared::sign::{self, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use futures_util::StreamExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who signed a request: a digest of the secret that matched (stable across reloads, naming
/// no secret), for what must stay with its caller; and its nonce, for the shared stores.
#[derive(Debug, Clone)]
pub(crate) struct Signer {
    pub credential: String,
    pub nonce: Seen,
}

pub(crate) struct Verifier {
    /// Replaced whole on a reload (`set_secrets`): a secret taken out is refused from then on.
    keys: std::sync::RwLock<std::sync::Arc<Keys>>,
    max_skew_s: u64,
    body_limit: usize,
    body_timeout: Duration,
    nonces: NonceStore,
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

// Looked up by a name made once: a `&str` name is parsed and validated on every lookup.
const TIMESTAMP: HeaderName = HeaderName::from_static(HEADER_TIMESTAMP);
const NONCE: HeaderName = HeaderName::from_static(HEADER_NONCE);
const SIGNATURE: HeaderName = HeaderName::from_static(HEADER_SIGNATURE);

fn header<'a>(req: &'a HttpRequest, name: &HeaderName) -> Result<Option<&'a str>, ApiError> {
    match req.headers().get(name) {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| {
            // The constants' own names, as the refusal's message wants them (&'static).
            let name = [HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE]
                .into_iter()
                .find(|n| *n == name.as_str())
                .unwrap_or(HEADER_SIGNATURE);
            ApiError::Auth(sign::SignError::Malformed(name))
        }),
    }
}

/// The accepted secrets, and each one's credential (a digest naming no secret), made once
/// rather than per request.
struct Keys {
    secrets: Vec<Vec<u8>>,
    credentials: Vec<String>,
}

impl Keys {
    fn new(secrets: Vec<Vec<u8>>) -> Keys {
        let credentials = secrets
            .iter()
            .map(|s| {
                use sha2::Digest;
                hex::encode(&sha2::Sha256::digest(s)[..8])
            })
            .collect();
        Keys {
            secrets,
            credentials,
        }
    }
}

impl Verifier {
    pub(crate) fn new(
        secrets: Vec<Vec<u8>>,
        max_skew_s: u64,
        body_limit: usize,
        body_timeout: Duration,
    ) -> Self {
        Verifier {
            keys: std::sync::RwLock::new(std::sync::Arc::new(Keys::new(secrets))),
            max_skew_s,
            body_limit,
            body_timeout,
            nonces: NonceStore::new(max_skew_s),
        }
    }

    /// Reads the body (bounded in size and time) and checks the request's signature over it:
    /// the body and who signed it, only if the request is authentic, fresh and not a replay.
    pub(crate) async fn authenticate_as(
        &self,
        req: &HttpRequest,
        payload: web::Payload,
    ) -> Result<(Bytes, Signer), ApiError> {
        let headers = sign::parse_headers(
            header(req, &TIMESTAMP)?,
            header(req, &NONCE)?,
            header(req, &SIGNATURE)?,
        )
        .map_err(ApiError::Auth)?;
        let now = now_s();
        // Formats and the clock window first: a stale or malformed request is refused before
        // its body is read and hashed.
        let checked =
            sign::check_headers(&headers, now, self.max_skew_s).map_err(ApiError::Auth)?;
        let body = self.read_body(req, payload).await?;
        let path_and_query = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.path(), |pq| pq.as_str());
        let signed = sign::SignedRequest {
            headers: &headers,
            method: req.method().as_str(),
            path_and_query,
            body: &body,
        };
        let keys = self.keys();
        let verified =
            sign::verify_checked(&keys.secrets, &signed, &checked).map_err(ApiError::Auth)?;
        let nonce = self
            .nonces
            .check_and_insert(&verified.nonce, verified.timestamp, now)?;
        let credential = keys
            .credentials
            .get(verified.secret)
            .cloned()
            .unwrap_or_default();
        Ok((body, Signer { credential, nonce }))
    }

    fn keys(&self) -> std::sync::Arc<Keys> {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The secrets accepted from now on (a reload).
    pub(crate) fn set_secrets(&self, secrets: Vec<Vec<u8>>) {
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) =
            std::sync::Arc::new(Keys::new(secrets));
    }

    /// The body, within `server.body_limit_bytes` and the body deadline.
    pub(crate) async fn read_body(
        &self,
        req: &HttpRequest,
        payload: web::Payload,
    ) -> Result<Bytes, ApiError> {
        let too_large = ApiError::PayloadTooLarge {
            limit: self.body_limit,
        };
        let declared = req
            .headers()
            .get(actix_web::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > self.body_limit) {
            return Err(too_large);
        }
        let limit = self.body_limit;
        let read = async move {
            let mut payload = payload;
            let mut buf = BytesMut::new();
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|_| ApiError::bad_request("could not read the body"))?;
                if buf.len() + chunk.len() > limit {
                    return Err(too_large);
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(buf.freeze())
        };
        let mut read = std::pin::pin!(read);
        // A body that came whole with the headers (the usual case) needs no timer.
        if let Some(done) = futures_util::FutureExt::now_or_never(read.as_mut()) {
            return done;
        }
        tokio::time::timeout(self.body_timeout, read)
            .await
            .map_err(|_| ApiError::bad_request("the body was not received in time"))?
    }
}

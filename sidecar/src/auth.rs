//! Request authentication: every `/v1` request is signed (see `ferry_shared::sign`), fresh and
//! never seen before. Runs before the body is parsed and before any Redis or Postgres work.

use crate::error::ApiError;
use actix_web::{web, HttpRequest};
use bytes::{Bytes, BytesMut};
use ferry_shared::sign::{self, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nonces seen within the clock window. A nonce only needs remembering until its timestamp
/// leaves the window: after that the timestamp check alone refuses a replay.
pub struct NonceStore {
    inner: Mutex<Nonces>,
    max: usize,
}

struct Nonces {
    /// nonce -> unix second after which it can be forgotten
    seen: HashMap<String, u64>,
    last_sweep_s: u64,
}

/// Sweeping costs one pass over the map; once every few seconds keeps it cheap.
const SWEEP_EVERY_S: u64 = 5;

impl NonceStore {
    pub fn new(max: usize) -> Self {
        NonceStore {
            inner: Mutex::new(Nonces {
                seen: HashMap::new(),
                last_sweep_s: 0,
            }),
            max,
        }
    }

    /// Records `nonce` until `forget_after_s`; refuses one already recorded.
    pub fn check_and_insert(
        &self,
        nonce: &str,
        forget_after_s: u64,
        now_s: u64,
    ) -> Result<(), ApiError> {
        let mut n = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if now_s >= n.last_sweep_s + SWEEP_EVERY_S || n.seen.len() >= self.max {
            n.seen.retain(|_, until| *until >= now_s);
            n.last_sweep_s = now_s;
        }
        // Case-insensitive: "ABCD..." and "abcd..." are the same random number.
        let key = nonce.to_ascii_lowercase();
        if n.seen.contains_key(&key) {
            return Err(ApiError::Replayed);
        }
        if n.seen.len() >= self.max {
            // Accepting without recording would let a replay through; refusing is safe.
            return Err(ApiError::Overloaded {
                what: "nonce store full",
            });
        }
        n.seen.insert(key, forget_after_s);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map(|n| n.seen.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct Verifier {
    secrets: Vec<Vec<u8>>,
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

fn header<'a>(req: &'a HttpRequest, name: &str) -> Result<Option<&'a str>, ApiError> {
    match req.headers().get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::Auth(sign::SignError::Malformed(static_name(name)))),
    }
}

fn static_name(name: &str) -> &'static str {
    match name {
        HEADER_TIMESTAMP => HEADER_TIMESTAMP,
        HEADER_NONCE => HEADER_NONCE,
        _ => HEADER_SIGNATURE,
    }
}

impl Verifier {
    pub fn new(
        secrets: Vec<Vec<u8>>,
        max_skew_s: u64,
        max_nonces: usize,
        body_limit: usize,
        body_timeout: Duration,
    ) -> Self {
        Verifier {
            secrets,
            max_skew_s,
            body_limit,
            body_timeout,
            nonces: NonceStore::new(max_nonces),
        }
    }

    /// Reads the body (bounded in size and time) and checks the request's signature over it.
    /// Returns the body only if the request is authentic, fresh and not a replay.
    pub async fn authenticate(
        &self,
        req: &HttpRequest,
        payload: web::Payload,
    ) -> Result<Bytes, ApiError> {
        let headers = sign::parse_headers(
            header(req, HEADER_TIMESTAMP)?,
            header(req, HEADER_NONCE)?,
            header(req, HEADER_SIGNATURE)?,
        )
        .map_err(ApiError::Auth)?;
        let body = self.read_body(req, payload).await?;
        let path_and_query = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.path(), |pq| pq.as_str());
        let secrets: Vec<&[u8]> = self.secrets.iter().map(Vec::as_slice).collect();
        let now = now_s();
        let verified = sign::verify(
            &secrets,
            &headers,
            req.method().as_str(),
            path_and_query,
            &body,
            now,
            self.max_skew_s,
        )
        .map_err(ApiError::Auth)?;
        self.nonces.check_and_insert(
            &verified.nonce,
            verified.timestamp.saturating_add(self.max_skew_s),
            now,
        )?;
        Ok(body)
    }

    async fn read_body(&self, req: &HttpRequest, payload: web::Payload) -> Result<Bytes, ApiError> {
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
        tokio::time::timeout(self.body_timeout, read)
            .await
            .map_err(|_| ApiError::bad_request("the body was not received in time"))?
    }

    pub fn nonces(&self) -> &NonceStore {
        &self.nonces
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_are_refused_until_forgotten() {
        let store = NonceStore::new(10);
        store
            .check_and_insert("00112233445566778899", 1000, 900)
            .expect("first use");
        assert!(matches!(
            store.check_and_insert("00112233445566778899", 1000, 901),
            Err(ApiError::Replayed)
        ));
        assert!(matches!(
            store.check_and_insert("00112233445566778899".to_uppercase().as_str(), 1000, 901),
            Err(ApiError::Replayed)
        ));
        // After its window the entry is swept (the timestamp check refuses it from then on).
        store
            .check_and_insert("00112233445566778899", 2000, 1001 + SWEEP_EVERY_S)
            .expect("forgotten after the window");
    }

    #[test]
    fn full_store_refuses_rather_than_forgets() {
        let store = NonceStore::new(2);
        store
            .check_and_insert("a000000000000000", 100, 10)
            .expect("1");
        store
            .check_and_insert("b000000000000000", 100, 10)
            .expect("2");
        assert!(matches!(
            store.check_and_insert("c000000000000000", 100, 10),
            Err(ApiError::Overloaded { .. })
        ));
    }
}

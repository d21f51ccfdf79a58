//! Request ids: the edge generates one per request and sends it as `x-ferry-request-id`; the
//! sidecar logs every line of that request under it and returns it, so one request can be
//! followed across both halves. A missing or malformed id is replaced by a generated one.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Instrument;

pub const HEADER: &str = ferry_shared::api::REQUEST_ID_HEADER;

/// 1 to 64 characters of `[A-Za-z0-9_-]`: safe to log and to echo (the rule is shared).
pub use ferry_shared::api::valid_request_id as valid;

/// 16 hex characters, unique within the process (a counter and the clock, hashed).
pub fn generate() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let digest = Sha256::digest(format!("{n}:{t}:{}", std::process::id()));
    hex::encode(&digest[..8])
}

pub async fn middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| valid(v))
        .map_or_else(generate, str::to_string);
    let span = tracing::info_span!("request", request_id = %id);
    let mut res = next.call(req).instrument(span).await?;
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(HeaderName::from_static(HEADER), v);
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(valid("abc-123_X"));
        assert!(!valid(""));
        assert!(!valid("has space"));
        assert!(!valid(&"a".repeat(65)));
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert!(valid(&a) && a.len() == 16);
    }
}

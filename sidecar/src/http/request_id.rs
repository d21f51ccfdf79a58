//! Request ids: the edge generates one per request and sends it as `x-ferry-request-id`; the
//! sidecar logs every line of that request under it and returns it, so one request can be
//! followed across both halves. A missing or malformed id is replaced by a generated one.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Instrument;

pub(crate) const HEADER: &str = ferry_shared::api::REQUEST_ID_HEADER;

/// 1 to 64 characters of `[A-Za-z0-9_-]`: safe to log and to echo (the rule is shared).
pub(crate) use ferry_shared::api::valid_request_id as valid;

/// 16 hex characters, unique within the process: a counter, offset by a random start and
/// mixed by splitmix64's finalizer, which is a bijection on 64 bits (so two requests never get
/// one id) and costs no system call or hash per request. The random start keeps ids apart
/// across restarts and sidecars.
pub(crate) fn generate() -> String {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(rand::random);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}", mix(start.wrapping_add(n)))
}

/// splitmix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) async fn middleware(
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
        let many: std::collections::HashSet<String> = (0..10_000).map(|_| generate()).collect();
        assert_eq!(many.len(), 10_000);
    }
}

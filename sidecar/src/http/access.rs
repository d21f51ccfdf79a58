//! Every request's route, status and latency into the metrics (`crate::metrics`), and its
//! access line: the actix middleware around every route.

use crate::metrics::global;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use std::time::Instant;

/// Records every request's route (the matched pattern, so ids never explode the label set),
/// status and latency, and writes its access line (target `ferry::access`, at info). The line
/// is formatted only when that level is on: actix's own Logger rendered every request's line
/// up front, about 4,000 instructions a request, even with access lines filtered out.
pub(crate) async fn middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let start = Instant::now();
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".into());
    let line = tracing::enabled!(target: "ferry::access", tracing::Level::INFO).then(|| {
        let head = req.head();
        format!("{} {} {:?}", head.method, head.uri, head.version)
    });
    let res = next.call(req).await?;
    let (status, took) = (res.status().as_u16(), start.elapsed());
    global().request(&route, status, took);
    if let Some(line) = line {
        let ms = took.as_secs_f64() * 1000.0;
        tracing::info!(target: "ferry::access", "{line} {status} {ms:.3}ms");
    }
    Ok(res)
}

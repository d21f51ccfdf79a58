//! The one place a failure (`crate::error::ApiError`) becomes HTTP: its status, the body sent
//! (only what is safe to show), Retry-After, and the one log line.
//!
//! Internal detail (driver messages, addresses) is carried in `internal` fields, logged once
//! here, and never sent: the client gets the stable code and a fixed message.

use crate::error::ApiError;
use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use ferry_shared::error::ErrorDetail;
use ferry_shared::ErrorBody;

impl ApiError {
    /// The body sent to the client: only what is safe to show.
    pub fn body(&self) -> ErrorBody {
        if let ApiError::InStatement { index, source } = self {
            let mut body = source.body();
            body.error.statement = Some(*index);
            body.error.message = format!("statement {index}: {}", body.error.message);
            body.error.field = Some(match body.error.field.take() {
                Some(f) => format!("statements[{index}].{f}"),
                None => format!("statements[{index}]"),
            });
            return body;
        }
        let mut detail = ErrorDetail {
            code: self.code(),
            message: String::new(),
            pg_code: None,
            field: None,
            statement: None,
        };
        detail.message = match self {
            ApiError::InStatement { .. } => String::new(),
            ApiError::TransactionNotFound
            | ApiError::TransactionBusy
            | ApiError::TransactionAborted => self.to_string(),
            ApiError::BadRequest { message, field } => {
                detail.field = field.clone();
                message.clone()
            }
            ApiError::InvalidValue { field, message } => {
                detail.field = Some(field.clone());
                format!("{field}: {message}")
            }
            ApiError::BadParams { message, pg_code } => {
                detail.pg_code = pg_code.clone();
                message.clone()
            }
            ApiError::Sql { pg_code, message } => {
                detail.pg_code = Some(pg_code.clone());
                message.clone()
            }
            ApiError::Postgres(f) => {
                detail.pg_code = Some(f.code.clone());
                f.message.clone()
            }
            ApiError::Auth(e) => e.message(),
            ApiError::Replayed => "nonce already used".into(),
            ApiError::Unauthorized { what } => format!("unknown {what}"),
            ApiError::EndUser { message } => {
                detail.field = Some("Authorization".into());
                message.clone()
            }
            ApiError::PayloadTooLarge { .. }
            | ApiError::StatementNotAllowed { .. }
            | ApiError::ResultTooLarge { .. }
            | ApiError::UnsupportedType { .. }
            | ApiError::NotText { .. } => self.to_string(),
            ApiError::NotFound => "no such route".into(),
            ApiError::UnsupportedMediaType => "the body must be application/json".into(),
            ApiError::NotCached => "not in the cache, and cache.mode is only-if-cached".into(),
            ApiError::NeverCached { why } => {
                format!("cache.mode is only-if-cached, and this read is never cached: {why}")
            }
            ApiError::RawSqlForbidden => {
                "raw SQL is not allowed here: send a named query (\"query\": \"NAME\")".into()
            }
            ApiError::RoleNotAllowed { .. } => {
                "identity.role is not one this sidecar lets a request assume (identity.roles)"
                    .into()
            }
            ApiError::RateLimited { retry_after_s } => {
                format!("too many requests from this caller; retry in {retry_after_s} s")
            }
            ApiError::MethodNotAllowed => "method not allowed on this route".into(),
            ApiError::Overloaded { what } => format!("overloaded ({what}); retry later"),
            ApiError::DatabaseUnavailable { .. } => "postgres is unavailable".into(),
            ApiError::OutcomeUnknown { kept: true, .. } => "the connection to postgres was lost \
                 during this write's commit and postgres could not be asked whether it committed: \
                 ask POST /v1/outcome with this request's nonce"
                .into(),
            ApiError::OutcomeUnknown { kept: false, .. } => "the connection to postgres was lost \
                 during this write's commit, so it may have committed, and no outcome is kept for \
                 it (auth.replay = \"local\", or Neon's /sql, which is not signed): read back \
                 before sending it again"
                .into(),
            ApiError::CacheUnavailable { .. } => "redis is unavailable".into(),
            ApiError::CacheOutcomeUnknown { .. } => "the connection to redis failed after this \
                 command could have been sent, so it may have run: read the value back before \
                 sending it again"
                .into(),
            ApiError::Timeout { what } => format!("timed out waiting for {what}"),
            ApiError::Upstream { .. } => "an upstream store failed".into(),
            ApiError::Internal { .. } => "internal error".into(),
        };
        ErrorBody { error: detail }
    }
}

/// Retry-After on 503s, in seconds. Set once at startup from config (`server.retry_after_s`).
static RETRY_AFTER_S: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub(crate) fn set_retry_after_s(s: u64) {
    RETRY_AFTER_S.store(s.max(1), std::sync::atomic::Ordering::Relaxed);
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code().http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        self.respond_with(&self.body())
    }
}

impl ApiError {
    /// The response for this error with `body` as its JSON (protocol-compatible routes shape
    /// their own), logged, counted and given Retry-After like every other error response.
    pub fn respond_with(&self, body: &impl serde::Serialize) -> HttpResponse {
        let status = self.status_code();
        crate::metrics::global().error(self.code().as_str());
        // The one log line for this failure; internal detail goes here and only here.
        if status.is_server_error() {
            tracing::warn!(code = self.code().as_str(), status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(code = self.code().as_str(), status = status.as_u16(), error = %self, "request refused");
        }
        let mut resp = HttpResponse::build(status);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            let s = RETRY_AFTER_S.load(std::sync::atomic::Ordering::Relaxed);
            resp.insert_header((header::RETRY_AFTER, s.to_string()));
        }
        if let ApiError::RateLimited { retry_after_s } = self {
            resp.insert_header((header::RETRY_AFTER, retry_after_s.to_string()));
        }
        resp.json(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_detail_never_reaches_the_body() {
        let secret_detail = "connection to 10.0.0.5:5432 failed: password authentication";
        for e in [
            ApiError::DatabaseUnavailable {
                internal: secret_detail.into(),
            },
            ApiError::Upstream {
                internal: secret_detail.into(),
            },
            ApiError::internal(secret_detail),
            ApiError::CacheUnavailable {
                internal: secret_detail.into(),
            },
        ] {
            let body = serde_json::to_string(&e.body()).expect("serializes");
            assert!(!body.contains("10.0.0.5"), "{body}");
            assert!(!body.contains("password"), "{body}");
        }
    }

    #[test]
    fn overload_carries_retry_after() {
        let resp = ApiError::Overloaded {
            what: "postgres pool",
        }
        .error_response();
        assert_eq!(resp.status(), 503);
        assert!(resp.headers().contains_key(header::RETRY_AFTER));
    }
}

//! Every failure the sidecar can answer with, and the one place it becomes HTTP.
//!
//! Internal detail (driver messages, addresses) is carried in `internal` fields, logged once
//! here, and never sent: the client gets the stable code and a fixed message.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use ferry_shared::error::ErrorDetail;
use ferry_shared::sign::SignError;
use ferry_shared::{ErrorBody, ErrorCode};

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON or a field of the wrong type; `field` is the JSON path when known.
    #[error("bad request: {message}")]
    BadRequest {
        message: String,
        field: Option<String>,
    },
    /// Well-formed but not allowed.
    #[error("invalid value for {field}: {message}")]
    InvalidValue { field: String, message: String },
    #[error("body larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("auth: {0}")]
    Auth(SignError),
    #[error("auth: nonce replayed")]
    Replayed,
    /// A bearer-style credential (a token of `[upstash]` or `[neon]`) is not one Ferry knows.
    #[error("unauthorized: unknown {what}")]
    Unauthorized { what: &'static str },
    /// An end user's token (`Authorization: Bearer <JWT>` at the Neon door) did not check out;
    /// the message says what is wrong with it, never what was expected.
    #[error("unauthorized: {message}")]
    EndUser { message: String },
    /// Parameters do not fit the statement, or Postgres refused a parameter value.
    #[error("bad params: {message}")]
    BadParams {
        message: String,
        pg_code: Option<String>,
    },
    /// Postgres refused the caller's own SQL; its message is about the caller's SQL, so it is
    /// passed on (it names no server internals).
    #[error("sql error {pg_code}: {message}")]
    Sql { pg_code: String, message: String },
    /// The same, with every field Postgres gave (`/sql` answers them, as Neon's proxy does).
    #[error("sql error {}: {}", .0.code, .0.message)]
    Postgres(Box<PgFields>),
    /// The statement's class is refused on this route (see `statement.rs`).
    #[error("statement not allowed ({class}): {advice}")]
    StatementNotAllowed {
        class: &'static str,
        advice: &'static str,
    },
    /// A result grew past a configured limit (named) while it was being read.
    #[error("the result is larger than {limit}; narrow the query (LIMIT, fewer columns) or raise the limit")]
    ResultTooLarge { limit: String },
    #[error("column {column} has type {type_name}, which Ferry cannot map to JSON")]
    UnsupportedType { column: String, type_name: String },
    #[error("cached value for key {key} is not UTF-8 text")]
    NotText { key: String },
    #[error("not found")]
    NotFound,
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("not cached")]
    NotCached,
    #[error("raw sql forbidden")]
    RawSqlForbidden,
    #[error("role not allowed: {role}")]
    RoleNotAllowed { role: String },
    /// One end user over `identity.rate_per_s`: retry after this many seconds.
    #[error("rate limited: retry after {retry_after_s} s")]
    RateLimited { retry_after_s: u64 },
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Pool exhausted, in-flight limit reached or nonce store full.
    #[error("overloaded: {what}")]
    Overloaded { what: &'static str },
    #[error("postgres unavailable: {internal}")]
    DatabaseUnavailable { internal: String },
    /// A write's connection was lost during its COMMIT: it may have committed. `kept`: its
    /// outcome is kept (its nonce row), and `POST /v1/outcome` will tell.
    #[error("write outcome unknown: {internal}")]
    OutcomeUnknown { internal: String, kept: bool },
    #[error("redis unavailable: {internal}")]
    CacheUnavailable { internal: String },
    /// A cache command that may not run twice (INCR) lost its connection or its reply after it
    /// could have been sent: it may have run.
    #[error("cache command outcome unknown: {internal}")]
    CacheOutcomeUnknown { internal: String },
    #[error("timed out: {what}")]
    Timeout { what: &'static str },
    #[error("upstream error: {internal}")]
    Upstream { internal: String },
    #[error("internal error: {internal}")]
    Internal { internal: String },
    #[error("no such transaction (unknown, expired or ended)")]
    TransactionNotFound,
    #[error("the transaction is running another statement")]
    TransactionBusy,
    /// Postgres's 25P02: a statement failed earlier in the transaction, which is now aborted.
    #[error(
        "a statement failed earlier in this transaction, so postgres aborted it: it was \
             rolled back and nothing of it committed"
    )]
    TransactionAborted,
    /// A statement of a transaction failed, and everything was rolled back.
    #[error("statement {index}: {source}")]
    InStatement { index: usize, source: Box<ApiError> },
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            field: None,
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidValue {
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn internal(internal: impl std::fmt::Display) -> Self {
        ApiError::Internal {
            internal: internal.to_string(),
        }
    }

    /// This error, as the failure of statement `index` of a transaction.
    pub fn in_statement(self, index: usize) -> ApiError {
        ApiError::InStatement {
            index,
            source: Box::new(self),
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::InStatement { source, .. } => source.code(),
            ApiError::TransactionNotFound => ErrorCode::TransactionNotFound,
            ApiError::TransactionBusy => ErrorCode::TransactionBusy,
            ApiError::TransactionAborted => ErrorCode::TransactionAborted,
            ApiError::BadRequest { .. } => ErrorCode::BadRequest,
            ApiError::InvalidValue { .. } => ErrorCode::InvalidValue,
            ApiError::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            ApiError::Auth(e) => e.code(),
            ApiError::Replayed => ErrorCode::AuthReplayed,
            ApiError::Unauthorized { .. } | ApiError::EndUser { .. } => ErrorCode::Unauthorized,
            ApiError::BadParams { .. } => ErrorCode::BadParams,
            ApiError::Sql { .. } | ApiError::Postgres(_) => ErrorCode::SqlError,
            ApiError::StatementNotAllowed { .. } => ErrorCode::StatementNotAllowed,
            ApiError::ResultTooLarge { .. } => ErrorCode::ResultTooLarge,
            ApiError::UnsupportedType { .. } => ErrorCode::UnsupportedType,
            ApiError::NotText { .. } => ErrorCode::NotText,
            ApiError::NotFound => ErrorCode::NotFound,
            ApiError::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            ApiError::NotCached => ErrorCode::NotCached,
            ApiError::RawSqlForbidden => ErrorCode::RawSqlForbidden,
            ApiError::RoleNotAllowed { .. } => ErrorCode::RoleNotAllowed,
            ApiError::RateLimited { .. } => ErrorCode::RateLimited,
            ApiError::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            ApiError::Overloaded { .. } => ErrorCode::Overloaded,
            ApiError::DatabaseUnavailable { .. } => ErrorCode::DatabaseUnavailable,
            ApiError::OutcomeUnknown { .. } | ApiError::CacheOutcomeUnknown { .. } => {
                ErrorCode::OutcomeUnknown
            }
            ApiError::CacheUnavailable { .. } => ErrorCode::CacheUnavailable,
            ApiError::Timeout { .. } => ErrorCode::Timeout,
            ApiError::Upstream { .. } => ErrorCode::UpstreamError,
            ApiError::Internal { .. } => ErrorCode::Internal,
        }
    }

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

pub fn set_retry_after_s(s: u64) {
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

/// A Postgres error's fields about the caller's statement, named as node-postgres (and the
/// Neon driver's `NeonDbError`) name them. Postgres's source location (file, line, routine) is
/// left out: it is about the server, not the caller's SQL.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PgFields {
    pub message: String,
    pub code: String,
    pub severity: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
    pub position: Option<String>,
    pub internal_position: Option<String>,
    pub internal_query: Option<String>,
    #[serde(rename = "where")]
    pub where_: Option<String>,
    pub schema: Option<String>,
    pub table: Option<String>,
    pub column: Option<String>,
    pub data_type: Option<String>,
    pub constraint: Option<String>,
}

impl ApiError {
    /// The response for this error with `body` as its JSON (protocol-compatible routes shape
    /// their own), logged, counted and given Retry-After like every other error response.
    pub fn respond_with(&self, body: &impl serde::Serialize) -> HttpResponse {
        let status = self.status_code();
        crate::http::metrics::global().error(self.code().as_str());
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

//! What can go wrong, in the engine's words: every failure a store, the read engine or a door
//! can report, with the stable code each one carries. Nothing here knows HTTP: `http/error.rs`
//! is the one place a failure becomes a response (status, body, Retry-After, the log line), and
//! the protocol doors shape their own bodies from the same value.

use ferry_shared::sign::SignError;
use ferry_shared::ErrorCode;

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
    /// The statement's class is refused on this route (see `store/statements/class.rs`).
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
    /// `only-if-cached` for a read that can never be cached (`read::inferred`): why not.
    #[error("never cached: {why}")]
    NeverCached { why: String },
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
            ApiError::NotCached | ApiError::NeverCached { .. } => ErrorCode::NotCached,
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

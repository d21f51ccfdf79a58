//! The JSON error body: `{"error": {"code": "...", "message": "...", ...}}`.
//!
//! `code` is stable (clients branch on it); `message` is for humans and may change.

use serde::{Deserialize, Serialize};

/// Stable error codes. Serialized in snake_case (`ErrorCode::AuthMissing` is `"auth_missing"`).
/// New codes may be added within `/v1`; clients should treat an unknown code by its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The body is not valid JSON, or a field has the wrong type or is missing (400).
    BadRequest,
    /// A value is well-formed but not allowed (a TTL of 0, an empty key...) (400).
    InvalidValue,
    /// Statement parameters do not match the statement (count, or a value Postgres refused) (400).
    BadParams,
    /// Postgres refused the caller's SQL (syntax, constraint, type...); `pg_code` says why (400).
    SqlError,
    /// The statement is of a class this route refuses (transaction control, session state,
    /// a write sent as a read); the message names the class (400).
    StatementNotAllowed,
    /// A result column has a type Ferry cannot map to JSON; the message names it (422).
    UnsupportedType,
    /// A read's or a batch's result is larger than a configured limit (rows or bytes); the
    /// message names the limit (422).
    ResultTooLarge,
    /// A cached value is not UTF-8 text and cannot be returned as a JSON string (422).
    NotText,
    /// The body is larger than the configured limit (413).
    PayloadTooLarge,
    /// The body is declared as something other than application/json (415).
    UnsupportedMediaType,
    /// Edge: the route needs `Authorization: Bearer <key>` and none, or a wrong one, was sent
    /// (401).
    Unauthorized,
    /// The request is not signed (401).
    AuthMissing,
    /// A signature header is present but malformed (401).
    AuthMalformed,
    /// The signed timestamp is outside the allowed clock window (401).
    AuthExpired,
    /// The signature does not match (401).
    AuthBadSignature,
    /// The nonce was already used within the window (401).
    AuthReplayed,
    /// No such route (404).
    NotFound,
    /// `cache.mode = only-if-cached` and the entry is not in the cache (404).
    NotCached,
    /// An interactive transaction id that is unknown, expired or ended (404).
    TransactionNotFound,
    /// An interactive transaction that is already running a statement (409).
    TransactionBusy,
    /// A statement of the transaction failed, so Postgres aborted it: it was rolled back and
    /// nothing of it committed (409).
    TransactionAborted,
    /// Raw SQL was sent to a sidecar with `auth.allow_raw_sql = false` (403).
    RawSqlForbidden,
    /// A request's `identity.role` is not one the sidecar's `identity.roles` lets it assume, or
    /// the sidecar takes no identities (403).
    RoleNotAllowed,
    /// One end user (an `identity`) sent more than `identity.rate_per_s` allows; retry after
    /// the `Retry-After` seconds (429).
    RateLimited,
    /// The route exists but not for this method (405).
    MethodNotAllowed,
    /// Every connection is busy or the sidecar is at its in-flight limit; retry (503).
    Overloaded,
    /// Postgres could not be reached (503).
    DatabaseUnavailable,
    /// The connection to Postgres was lost during a write's COMMIT and Postgres could not be
    /// asked whether it committed (503): ask `POST /v1/outcome` with the request's nonce.
    OutcomeUnknown,
    /// Redis could not be reached for a cache command (503). Reads never fail for this.
    CacheUnavailable,
    /// Postgres did not answer in time (504).
    Timeout,
    /// Redis or Postgres failed in a way that is not the caller's fault (502).
    UpstreamError,
    /// A bug or an unexpected state in the sidecar (500). Details are in its log only.
    Internal,
    /// Edge: the sidecar could not be reached (502).
    SidecarUnreachable,
    /// Edge: the sidecar did not answer within the edge's timeout (504).
    SidecarTimeout,
    /// Edge: the sidecar answered something the edge cannot decode (502).
    SidecarBadResponse,
    /// Edge: the sidecar refused the edge's signature: the two secrets differ (502).
    SidecarAuthFailed,
    /// Edge: a required binding (FERRY_SECRET, FERRY_SIDECAR_URL...) is missing or invalid (500).
    EdgeMisconfigured,
    /// Edge: a transaction committed (a sidecar said so when asked for its outcome, and applied
    /// its invalidations), but its answer, with its per-statement results, was lost with the
    /// sidecar that ran it (502). Do not send it again: read the rows back.
    CommittedResultsLost,
}

impl ErrorCode {
    /// The HTTP status each code is sent with. The single source of truth for both sides.
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            BadRequest | InvalidValue | BadParams | SqlError | StatementNotAllowed => 400,
            Unauthorized | AuthMissing | AuthMalformed | AuthExpired | AuthBadSignature
            | AuthReplayed => 401,
            RawSqlForbidden | RoleNotAllowed => 403,
            NotFound | NotCached | TransactionNotFound => 404,
            TransactionBusy | TransactionAborted => 409,
            MethodNotAllowed => 405,
            PayloadTooLarge => 413,
            RateLimited => 429,
            UnsupportedMediaType => 415,
            UnsupportedType | NotText | ResultTooLarge => 422,
            Internal | EdgeMisconfigured => 500,
            UpstreamError | SidecarUnreachable | SidecarBadResponse | SidecarAuthFailed
            | CommittedResultsLost => 502,
            Overloaded | DatabaseUnavailable | OutcomeUnknown | CacheUnavailable => 503,
            Timeout | SidecarTimeout => 504,
        }
    }

    /// The wire spelling, e.g. `"auth_missing"`.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BadRequest => "bad_request",
            InvalidValue => "invalid_value",
            BadParams => "bad_params",
            SqlError => "sql_error",
            StatementNotAllowed => "statement_not_allowed",
            UnsupportedType => "unsupported_type",
            ResultTooLarge => "result_too_large",
            NotText => "not_text",
            TransactionNotFound => "transaction_not_found",
            TransactionBusy => "transaction_busy",
            TransactionAborted => "transaction_aborted",
            PayloadTooLarge => "payload_too_large",
            UnsupportedMediaType => "unsupported_media_type",
            Unauthorized => "unauthorized",
            AuthMissing => "auth_missing",
            AuthMalformed => "auth_malformed",
            AuthExpired => "auth_expired",
            AuthBadSignature => "auth_bad_signature",
            AuthReplayed => "auth_replayed",
            NotFound => "not_found",
            NotCached => "not_cached",
            RawSqlForbidden => "raw_sql_forbidden",
            RoleNotAllowed => "role_not_allowed",
            RateLimited => "rate_limited",
            MethodNotAllowed => "method_not_allowed",
            Overloaded => "overloaded",
            DatabaseUnavailable => "database_unavailable",
            OutcomeUnknown => "outcome_unknown",
            CacheUnavailable => "cache_unavailable",
            Timeout => "timeout",
            UpstreamError => "upstream_error",
            Internal => "internal",
            SidecarUnreachable => "sidecar_unreachable",
            SidecarTimeout => "sidecar_timeout",
            SidecarBadResponse => "sidecar_bad_response",
            SidecarAuthFailed => "sidecar_auth_failed",
            EdgeMisconfigured => "edge_misconfigured",
            CommittedResultsLost => "committed_results_lost",
        }
    }
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
    /// The SQLSTATE, when Postgres refused the caller's own SQL (e.g. `"42601"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_code: Option<String>,
    /// The JSON path of the offending request field, when one is to blame (e.g. `"cache.ttl_s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// In a transaction: the index of the statement that failed (everything was rolled back;
    /// the number of statements when the COMMIT itself failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<usize>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code,
                message: message.into(),
                pg_code: None,
                field: None,
                statement: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_spelling_matches_serde() {
        for code in [
            ErrorCode::BadRequest,
            ErrorCode::AuthReplayed,
            ErrorCode::PayloadTooLarge,
            ErrorCode::DatabaseUnavailable,
            ErrorCode::OutcomeUnknown,
            ErrorCode::SidecarAuthFailed,
            ErrorCode::EdgeMisconfigured,
            ErrorCode::RoleNotAllowed,
            ErrorCode::RateLimited,
            ErrorCode::CommittedResultsLost,
        ] {
            let json = serde_json::to_value(code).expect("serializes");
            assert_eq!(json, serde_json::Value::String(code.as_str().to_string()));
        }
    }

    #[test]
    fn optional_fields_are_omitted() {
        let body = ErrorBody::new(ErrorCode::NotFound, "no such route");
        let json = serde_json::to_string(&body).expect("serializes");
        assert_eq!(
            json,
            r#"{"error":{"code":"not_found","message":"no such route"}}"#
        );
    }
}

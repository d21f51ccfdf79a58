//! Every failure the edge answers with, mapped to a status and the shared JSON error body.
//! A failure is always an answer (never a panic: a panic kills the isolate).

use ferry_shared::api::{InvalidationStatus, Position};
use ferry_shared::error::ErrorDetail;
use ferry_shared::{ErrorBody, ErrorCode};

#[derive(Debug, Clone, PartialEq)]
/// Every failure the edge answers with; [`EdgeError::status`] and [`EdgeError::body`] make the response.
pub enum EdgeError {
    /// The client's request is wrong (bad id, bad body...).
    Invalid {
        /// The stable code.
        code: ErrorCode,
        /// What is wrong, for humans.
        message: String,
        /// The request field to blame, if one is.
        field: Option<String>,
    },
    /// The thing asked for does not exist.
    NotFound(String),
    /// The sidecar answered with an error of its own: passed through as is (its bodies never
    /// carry internal detail), with its Retry-After when it sent one.
    Sidecar {
        /// The sidecar's status.
        status: u16,
        /// The sidecar's JSON error, as it sent it.
        body: ErrorBody,
        /// The sidecar's Retry-After, if any.
        retry_after: Option<String>,
    },
    /// The sidecar could not be reached (connection refused, DNS, TLS...).
    Unreachable,
    /// The sidecar did not answer in time.
    Timeout {
        /// The timeout that passed, in milliseconds.
        after_ms: u64,
    },
    /// The sidecar answered with something that is not the expected JSON.
    BadResponse {
        /// The status it answered with.
        status: u16,
    },
    /// The sidecar refused our signature: FERRY_SECRET differs between the two halves.
    AuthFailed,
    /// A binding is missing or invalid; names the binding, never its value.
    Misconfigured(String),
    /// The route needs the API key (writes and the cache routes), and it was not given.
    Unauthorized(String),
    /// The path exists, not under this method; the methods it takes (the `Allow` header).
    MethodNotAllowed(&'static str),
    /// Past the anonymous budget (or a user's rate): retry after this many seconds.
    RateLimited {
        /// Seconds to wait (Retry-After).
        retry_after_s: u64,
    },
    /// The auth provider's keys (`FERRY_JWKS_URL`) could not be fetched: not the caller's
    /// fault, and worth a retry.
    KeysUnavailable,
    /// A transaction's answer was lost with its sidecar, and another sidecar, asked for its
    /// outcome, said it committed (and applied its invalidations): its per-statement results
    /// are gone, what the outcome keeps is here. Never to be sent again (502
    /// `committed_results_lost`, no Retry-After). A handler that needs no results may answer
    /// it as the success it is.
    CommittedWithoutResults {
        /// Rows affected by all its statements together.
        rows_affected: u64,
        /// Its invalidations, applied again by the sidecar that answered the outcome.
        invalidation: InvalidationStatus,
        /// Where its commit is (read-your-writes), when the sidecar tracks positions.
        position: Option<Position>,
    },
}

/// The runtime's own failures (reading a header or the body): the request could not be read.
#[cfg(target_arch = "wasm32")]
impl From<worker::Error> for EdgeError {
    fn from(_: worker::Error) -> Self {
        EdgeError::bad_request("the request could not be read")
    }
}

impl EdgeError {
    /// 400 `invalid_value`, naming the field.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        EdgeError::Invalid {
            code: ErrorCode::InvalidValue,
            message: message.into(),
            field: Some(field.to_string()),
        }
    }

    /// One failed read of a batch, as if the sidecar had answered it alone.
    pub fn from_detail(detail: ErrorDetail) -> Self {
        EdgeError::Sidecar {
            status: detail.code.http_status(),
            body: ErrorBody { error: detail },
            retry_after: None,
        }
    }

    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        EdgeError::Invalid {
            code: ErrorCode::BadRequest,
            message: message.into(),
            field: None,
        }
    }

    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            EdgeError::Sidecar { status, .. } => *status,
            other => other.code().http_status(),
        }
    }

    /// The stable error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            EdgeError::Invalid { code, .. } => *code,
            EdgeError::NotFound(_) => ErrorCode::NotFound,
            EdgeError::Sidecar { body, .. } => body.error.code,
            EdgeError::Unreachable => ErrorCode::SidecarUnreachable,
            EdgeError::Timeout { .. } => ErrorCode::SidecarTimeout,
            EdgeError::BadResponse { .. } => ErrorCode::SidecarBadResponse,
            EdgeError::AuthFailed => ErrorCode::SidecarAuthFailed,
            EdgeError::Misconfigured(_) => ErrorCode::EdgeMisconfigured,
            EdgeError::Unauthorized(_) => ErrorCode::Unauthorized,
            EdgeError::MethodNotAllowed(_) => ErrorCode::MethodNotAllowed,
            EdgeError::RateLimited { .. } => ErrorCode::RateLimited,
            EdgeError::KeysUnavailable => ErrorCode::UpstreamError,
            EdgeError::CommittedWithoutResults { .. } => ErrorCode::CommittedResultsLost,
        }
    }

    /// The Retry-After to send, in seconds, when a retry may help.
    pub fn retry_after(&self) -> Option<String> {
        match self {
            EdgeError::Sidecar { retry_after, .. } => retry_after.clone(),
            EdgeError::Unreachable | EdgeError::Timeout { .. } | EdgeError::KeysUnavailable => {
                Some("1".into())
            }
            EdgeError::RateLimited { retry_after_s } => Some(retry_after_s.to_string()),
            _ => None,
        }
    }

    /// The JSON error body to send. A sidecar's error passes through, except Postgres's own
    /// words: the caller gets Ferry's code and the SQLSTATE, never the database's message
    /// (it may quote the caller's input, or name tables and columns). [`EdgeError::detail`]
    /// keeps the message, for the Worker's own log.
    pub fn body(&self) -> ErrorBody {
        if let EdgeError::Sidecar { body, .. } = self {
            let mut body = body.clone();
            if let Some(sqlstate) = &body.error.pg_code {
                body.error.message =
                    format!("the database refused the request (SQLSTATE {sqlstate})");
            }
            return body;
        }
        let (message, field) = match self {
            EdgeError::Invalid { message, field, .. } => (message.clone(), field.clone()),
            EdgeError::NotFound(m) | EdgeError::Unauthorized(m) => (m.clone(), None),
            EdgeError::MethodNotAllowed(allow) => (format!("this path takes {allow} only"), None),
            EdgeError::RateLimited { retry_after_s } => (
                format!("too many requests from this client: retry in {retry_after_s} s"),
                None,
            ),
            EdgeError::Unreachable => ("the sidecar could not be reached".into(), None),
            EdgeError::KeysUnavailable => (
                "the auth provider's signing keys could not be fetched; retry".into(),
                None,
            ),
            EdgeError::Timeout { after_ms } => (
                format!("the sidecar did not answer within {after_ms} ms"),
                None,
            ),
            EdgeError::BadResponse { status } => (
                format!("the sidecar answered {status} with a body the edge cannot read"),
                None,
            ),
            EdgeError::AuthFailed => (
                "the sidecar refused the edge's signature: FERRY_SECRET differs between the \
                 edge and the sidecar"
                    .into(),
                None,
            ),
            EdgeError::Misconfigured(what) => (format!("edge misconfigured: {what}"), None),
            EdgeError::CommittedWithoutResults { rows_affected, .. } => (
                format!(
                    "the transaction committed ({rows_affected} rows affected) but its sidecar \
                     was lost before its results reached the edge: do not send it again, read \
                     the rows back"
                ),
                None,
            ),
            EdgeError::Sidecar { .. } => (String::new(), None),
        };
        ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message,
                pg_code: None,
                field,
                statement: None,
            },
        }
    }
}

impl EdgeError {
    /// The sidecar's own message, Postgres's words included (for the Worker's log, never for
    /// the caller: [`EdgeError::body`] leaves them out).
    pub fn detail(&self) -> String {
        match self {
            EdgeError::Sidecar { body, .. } => body.error.message.clone(),
            other => other.body().error.message,
        }
    }
}

impl std::fmt::Display for EdgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code().as_str(),
            self.status(),
            self.detail()
        )
    }
}

impl std::error::Error for EdgeError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_words_never_reach_the_caller() {
        let mut body = ErrorBody::new(
            ErrorCode::BadParams,
            "invalid byte sequence for encoding \"UTF8\": 0x00",
        );
        body.error.pg_code = Some("22021".into());
        let e = EdgeError::Sidecar {
            status: 400,
            body,
            retry_after: None,
        };
        let sent = e.body().error;
        assert!(!sent.message.contains("UTF8"), "{}", sent.message);
        assert!(sent.message.contains("22021"), "{}", sent.message);
        assert_eq!(sent.pg_code.as_deref(), Some("22021"));
        assert!(e.to_string().contains("UTF8"), "the log keeps it: {e}");
    }

    #[test]
    fn statuses_follow_the_shared_table() {
        assert_eq!(EdgeError::Unreachable.status(), 502);
        assert_eq!(EdgeError::Timeout { after_ms: 5 }.status(), 504);
        assert_eq!(EdgeError::AuthFailed.status(), 502);
        assert_eq!(EdgeError::BadResponse { status: 200 }.status(), 502);
        assert_eq!(EdgeError::invalid("id", "bad").status(), 400);
        assert_eq!(EdgeError::NotFound("x".into()).status(), 404);
        assert_eq!(
            EdgeError::Misconfigured("FERRY_SECRET".into()).status(),
            500
        );
    }

    #[test]
    fn a_transaction_committed_without_results_is_never_to_be_retried() {
        let e = EdgeError::CommittedWithoutResults {
            rows_affected: 3,
            invalidation: InvalidationStatus::Done,
            position: None,
        };
        assert_eq!(e.status(), 502);
        assert_eq!(e.code(), ErrorCode::CommittedResultsLost);
        assert_eq!(e.retry_after(), None, "a retry would run it twice");
        let message = e.body().error.message;
        assert!(message.contains("committed (3 rows affected)"), "{message}");
        assert!(message.contains("do not send it again"), "{message}");
    }

    #[test]
    fn sidecar_errors_pass_through() {
        let body = ErrorBody::new(ErrorCode::Overloaded, "overloaded");
        let e = EdgeError::Sidecar {
            status: 503,
            body: body.clone(),
            retry_after: Some("2".into()),
        };
        assert_eq!(e.status(), 503);
        assert_eq!(e.body(), body);
        assert_eq!(e.retry_after().as_deref(), Some("2"));
    }
}

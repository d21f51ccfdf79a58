//! Postgres failures: whether a retry on a fresh connection makes sense, and how each reaches
//! the caller (by SQLSTATE class: the caller's own mistakes with Postgres's message, server
//! trouble without detail).

use crate::error::ApiError;
use postgres::error::SqlState;

/// A Postgres failure, split by whether a retry on a fresh connection makes sense.
pub(in crate::store) enum Failure {
    Closed(postgres::Error),
    /// The session was lost before any of the caller's statements was sent (a write's first
    /// round trip): safe to run the write on another session.
    Unsent(postgres::Error),
    Pg(postgres::Error),
    Api(ApiError),
}

impl From<postgres::Error> for Failure {
    fn from(e: postgres::Error) -> Self {
        if connection_lost(&e) || driver_statement_lost(&e) {
            Failure::Closed(e)
        } else {
            Failure::Pg(e)
        }
    }
}

/// The driver's own statement (one it prepared and keeps: its type lookups, named `s<n>`) is
/// gone from the session: a reset (`DISCARD ALL`) deallocated it and the driver cannot be told
/// (`session::RESET`). The session is as good as lost: dropped, and a read run again on
/// another. A request cannot name such a statement itself (prepared statements are refused up
/// front).
pub(in crate::store) fn driver_statement_lost(e: &postgres::Error) -> bool {
    e.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME)
        && e.as_db_error().is_some_and(|db| {
            db.message()
                .strip_prefix("prepared statement \"s")
                .and_then(|rest| rest.strip_suffix("\" does not exist"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The session is gone, as opposed to a statement that failed: closed, Postgres terminated it
/// (`pg_terminate_backend`, a restart: pooled sessions learn it on their next statement), or
/// its socket failed (a NAT, load balancer or pooler in between reset the connection: the
/// driver then reports the I/O error, "connection reset" or "broken pipe", not a close).
pub(in crate::store) fn connection_lost(e: &postgres::Error) -> bool {
    e.is_closed()
        || e.code()
            .is_some_and(|c| c.code().starts_with("57P") || c.code().starts_with("08"))
        || std::error::Error::source(e).is_some_and(|cause| cause.is::<std::io::Error>())
}

/// A COMMIT (or a statement committing on its own) that failed, where no outcome is kept to
/// ask: with its connection lost it may well have committed, and the answer must say so.
pub(in crate::store) fn commit_lost(e: postgres::Error) -> Failure {
    if connection_lost(&e) {
        Failure::Api(ApiError::OutcomeUnknown {
            internal: format!("connection lost during a commit with no kept outcome: {e}"),
            kept: false,
        })
    } else {
        Failure::from(e)
    }
}

impl Failure {
    pub(in crate::store) fn into_api(self) -> ApiError {
        match self {
            Failure::Api(a) => a,
            Failure::Closed(e) | Failure::Unsent(e) => ApiError::DatabaseUnavailable {
                internal: e.to_string(),
            },
            Failure::Pg(e) => map_pg_error(e),
        }
    }
}

/// A Postgres error for the operator's eyes (logs, `--check-config`): the driver's own text
/// says only "db error" for what the server said, so the server's message is added.
pub(crate) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// A Postgres failure as the caller sees it (the drivers share one error type).
pub(crate) fn pg_failure(e: postgres::Error) -> ApiError {
    Failure::from(e).into_api()
}

/// Postgres errors by SQLSTATE class: the caller's own mistakes are 400 with the code and
/// Postgres' message (about the caller's SQL); server trouble is 502/503/504 with no detail.
fn map_pg_error(e: postgres::Error) -> ApiError {
    let Some(db) = e.as_db_error() else {
        // Not from the server: I/O, protocol or conversion trouble on our side of the wire.
        return ApiError::DatabaseUnavailable {
            internal: e.to_string(),
        };
    };
    let code = db.code();
    let class = &code.code()[..2];
    if *code == SqlState::QUERY_CANCELED {
        return ApiError::Timeout {
            what: "postgres (statement_timeout)",
        };
    }
    if *code == SqlState::IN_FAILED_SQL_TRANSACTION {
        return ApiError::TransactionAborted;
    }
    match class {
        // connection exception, operator intervention (shutdown), insufficient resources
        "08" | "57" | "53" => ApiError::DatabaseUnavailable {
            internal: format!("{}: {}", code.code(), db.message()),
        },
        // system error, config file error, internal error: not the caller's to see
        "58" | "F0" | "XX" => ApiError::Upstream {
            internal: format!("{}: {}", code.code(), db.message()),
        },
        // Postgres could not read a parameter value: it says so in the error's context
        // ("unnamed portal parameter $1 = ...").
        _ if db.where_().is_some_and(|w| w.contains("portal parameter")) => ApiError::BadParams {
            message: db.message().to_string(),
            pg_code: Some(code.code().to_string()),
        },
        _ => ApiError::Sql {
            pg_code: code.code().to_string(),
            message: db.message().to_string(),
        },
    }
}

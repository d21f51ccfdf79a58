//! A Postgres failure on the `/sql` path as the Neon driver expects it: the caller's own with
//! Postgres's fields (a 400), server trouble as Ferry's 5xx with no detail, and a connection
//! lost during a COMMIT as an unknown outcome.

use crate::error::{ApiError, PgFields};

/// [`pg`] for a failure during a COMMIT (or a statement that commits on its own): the
/// connection lost then, it may have committed (`store::postgres::failure::commit_lost`).
pub(super) fn committing(e: tokio_postgres::Error) -> ApiError {
    if crate::store::postgres::failure::connection_lost(&e) {
        crate::store::postgres::failure::commit_lost(e).into_api()
    } else {
        pg(e)
    }
}

/// A Postgres failure: the caller's own (a 400 with Postgres's fields), or server trouble
/// (Ferry's 5xx, no detail).
pub(super) fn pg(e: tokio_postgres::Error) -> ApiError {
    let fields = e.as_db_error().map(|d| PgFields {
        message: d.message().to_string(),
        code: d.code().code().to_string(),
        severity: d.severity().to_string(),
        detail: d.detail().map(str::to_string),
        hint: d.hint().map(str::to_string),
        position: match d.position() {
            Some(tokio_postgres::error::ErrorPosition::Original(p)) => Some(p.to_string()),
            _ => None,
        },
        internal_position: match d.position() {
            Some(tokio_postgres::error::ErrorPosition::Internal { position, .. }) => {
                Some(position.to_string())
            }
            _ => None,
        },
        internal_query: match d.position() {
            Some(tokio_postgres::error::ErrorPosition::Internal { query, .. }) => {
                Some(query.clone())
            }
            _ => None,
        },
        where_: d.where_().map(str::to_string),
        schema: d.schema().map(str::to_string),
        table: d.table().map(str::to_string),
        column: d.column().map(str::to_string),
        data_type: d.datatype().map(str::to_string),
        constraint: d.constraint().map(str::to_string),
    });
    match (crate::store::postgres::failure::pg_failure(e), fields) {
        (ApiError::Sql { .. } | ApiError::BadParams { .. }, Some(f)) => {
            ApiError::Postgres(Box::new(f))
        }
        (api, _) => api,
    }
}

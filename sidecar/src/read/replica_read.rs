//! A plain read (one that skips the cache) on a streaming replica, when one may serve it
//! (`store::replicas`); the primary takes it when none may, or when the replica fails it.

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::read::Reads;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::statements::pooled;
use ferry_shared::api::{Position, Row};
use serde_json::Value;

/// Runs the read on a replica that has replayed past `after` (blocking; inside
/// `Blocking::run`). None: the primary must run it, because no replica may, or the one chosen
/// failed for its own reasons (it is then out of use until its next check finds it well).
/// The caller's own mistakes (SQL errors, bad parameters, results too large) are answered as
/// they are: the primary would say the same.
pub(crate) fn run(
    state: &Reads,
    after: Option<Position>,
    sql: &str,
    params: &[Value],
    limits: ReadLimits,
    who: Option<&SessionIdentity>,
) -> Option<Result<Vec<Row>, ApiError>> {
    let replicas = &state.replicas;
    let replica = replicas.pick(after)?;
    let out = pooled::query_replica(
        &state.pools,
        replica,
        replicas.wait(),
        sql,
        params,
        limits,
        who,
    );
    match out {
        Ok(rows) => {
            replica.served();
            Some(Ok(rows))
        }
        Err(e) if replica_trouble(&e) => {
            tracing::warn!(error = %e, "replica read failed; the primary answers it");
            if !matches!(e, ApiError::Overloaded { .. }) {
                replica.failed();
            }
            replicas.fell_back();
            None
        }
        Err(e) => Some(Err(e)),
    }
}

/// Failures of the replica rather than the read: it is down, busy, or cancelled the read
/// because replaying the primary's changes needed the rows it was reading (SQLSTATE 40001,
/// "conflict with recovery").
fn replica_trouble(e: &ApiError) -> bool {
    match e {
        ApiError::DatabaseUnavailable { .. }
        | ApiError::Upstream { .. }
        | ApiError::Overloaded { .. } => true,
        ApiError::Sql { pg_code, .. } => pg_code == "40001",
        _ => false,
    }
}

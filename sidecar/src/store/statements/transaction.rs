//! Several statements in one transaction on one pooled session (`/v1/transaction`): all commit
//! or none does, and the session goes back to the pool exactly as fresh as after any request.

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::store::coordination::nonces::{self, WriteNonce};
use crate::store::pools::session::{rollback, with_sent_session};
use crate::store::pools::Pools;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::statements::class::{self, Route};
use crate::store::statements::pooled::run_prepared;
use crate::store::statements::rows::{check_columns, read_rows};
use ferry_shared::api::{Isolation, StatementResult};
use serde_json::Value;
use std::sync::Arc;

/// A transaction ready to run: statements checked, options resolved.
#[derive(Debug, Clone)]
pub(crate) struct TxPlan {
    pub statements: Vec<(String, Vec<Value>)>,
    pub isolation: Isolation,
    pub read_only: bool,
    pub deferrable: bool,
    /// Bounds for each statement's returned rows.
    pub limits: ReadLimits,
    /// The end user every statement runs as (taken on right after BEGIN).
    pub identity: Option<Arc<SessionIdentity>>,
    /// The request's nonce, recorded in the same round trip as BEGIN (`store::coordination::nonces`).
    pub nonce: Option<WriteNonce>,
}

impl TxPlan {
    /// The statement that opens the transaction (options are enums: nothing from the caller is
    /// spliced in).
    pub(in crate::store) fn begin(&self) -> String {
        let isolation = match self.isolation {
            Isolation::ReadCommitted => "READ COMMITTED",
            Isolation::ReadUncommitted => "READ UNCOMMITTED",
            Isolation::RepeatableRead => "REPEATABLE READ",
            Isolation::Serializable => "SERIALIZABLE",
        };
        format!(
            "BEGIN ISOLATION LEVEL {isolation}, {}, {}",
            if self.read_only {
                "READ ONLY"
            } else {
                "READ WRITE"
            },
            if self.deferrable {
                "DEFERRABLE"
            } else {
                "NOT DEFERRABLE"
            }
        )
    }
}

/// Refuses, before anything runs, a statement that would control the transaction or outlive
/// it (the same classes `/v1/execute` refuses), naming its index.
pub(crate) fn check(statements: &[(String, Vec<Value>)]) -> Result<(), ApiError> {
    for (i, (sql, _)) in statements.iter().enumerate() {
        class::check(sql, Route::Write).map_err(|e| e.in_statement(i))?;
    }
    Ok(())
}

/// Runs the transaction; committed when this returns Ok. On any failure (a statement, or the
/// COMMIT itself, e.g. a serialization failure) everything is rolled back and the error names
/// the statement (the COMMIT counts as the one after the last). Never retried.
pub(crate) fn run(pools: &Pools, plan: &TxPlan) -> Result<Vec<StatementResult>, ApiError> {
    check(&plan.statements)?;
    with_sent_session(pools, |s| {
        // A read-only transaction cannot insert its nonce: it commits it first. Any other
        // inserts it with its COMMIT (`nonces`).
        let (first, last) = match &plan.nonce {
            Some(_) if plan.read_only => (plan.nonce.as_ref(), None),
            n => (None, n.as_ref()),
        };
        if first.is_some() {
            nonces::record_then(pools, s, first, &plan.begin())?;
        } else {
            nonces::begin(pools, s, last, &plan.begin())?;
        }
        let failed = |s: &mut crate::store::postgres::PgSession, f: Failure| {
            rollback(s);
            nonces::refuse_replays(s, last);
            f
        };
        if let Some(who) = &plan.identity {
            if let Err(f) = who.assume(&mut s.client) {
                return Err(failed(s, f));
            }
        }
        let mut out = Vec::with_capacity(plan.statements.len());
        for (i, (sql, params)) in plan.statements.iter().enumerate() {
            let ran = run_prepared(s, sql, params, check_columns, |mut rows| {
                let (kept, too_large) = read_rows(&mut rows, plan.limits)?;
                Ok((kept, too_large, rows.rows_affected()))
            });
            match ran {
                Ok((rows, None, affected)) => out.push(StatementResult {
                    rows_affected: affected.unwrap_or(0),
                    rows,
                }),
                Ok((_, Some(limit), _)) => {
                    // The rest of that result is still on its way: close the session.
                    s.poisoned = true;
                    return Err(Failure::Api(
                        ApiError::ResultTooLarge { limit }.in_statement(i),
                    ));
                }
                Err(f) => {
                    return Err(failed(s, Failure::Api(f.into_api().in_statement(i))));
                }
            }
        }
        let rows = out.iter().map(|r| r.rows_affected).sum();
        if let Err(f) = nonces::commit(pools, s, last, rows, plan.identity.is_some()) {
            let e = f.into_api();
            if matches!(e, ApiError::Replayed) {
                return Err(Failure::Api(e));
            }
            nonces::refuse_replays(s, last);
            return Err(Failure::Api(e.in_statement(plan.statements.len())));
        }
        Ok(out)
    })
    .map_err(Failure::into_api)
}

//! `/v1/transaction`'s wire types (re-exported from `api`).

use crate::api::{Identity, Invalidate, InvalidationStatus, Position, Row};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/transaction`: statements run in one transaction, all committed or none; the
/// invalidations are applied after the commit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransactionRequest {
    pub statements: Vec<TransactionStatement>,
    #[serde(default)]
    pub isolation: Isolation,
    /// READ ONLY: a statement that writes fails (and everything rolls back).
    #[serde(default)]
    pub read_only: bool,
    /// DEFERRABLE (Postgres heeds it for read-only serializable transactions only).
    #[serde(default)]
    pub deferrable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidate: Option<Invalidate>,
    /// The end user every statement runs as (see [`Identity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
}

/// `POST /v1/transaction/begin`: opens an interactive transaction on one pooled connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BeginRequest {
    #[serde(default)]
    pub isolation: Isolation,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub deferrable: bool,
    /// The end user the transaction runs as. Every later request on it must name the same
    /// user (role and `sub`), or the transaction is not found for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
}

/// The open transaction: its id (unguessable), and how long it may idle and live.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeginResponse {
    pub id: String,
    pub idle_timeout_ms: u64,
    pub max_lifetime_ms: u64,
}

/// `POST /v1/transaction/query`: one statement in an open transaction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InTransactionRequest {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default)]
    pub params: Vec<Value>,
    /// The user the transaction was begun as, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
}

/// `POST /v1/transaction/commit` (with invalidations after it) or `/rollback`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndRequest {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidate: Option<Invalidate>,
    /// The user the transaction was begun as, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
}

/// The answer to a commit or rollback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndResponse {
    pub committed: bool,
    pub invalidation: InvalidationStatus,
    /// As `ExecuteResponse::position`, after a commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
}

/// One statement of a transaction: exactly one of `sql` and `query`, as for `/v1/execute`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransactionStatement {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default)]
    pub params: Vec<Value>,
}

impl TransactionStatement {
    pub fn sql(sql: impl Into<String>, params: Vec<Value>) -> Self {
        TransactionStatement {
            sql: Some(sql.into()),
            query: None,
            params,
        }
    }
}

/// A transaction's isolation level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    #[default]
    ReadCommitted,
    /// Postgres runs it as read committed, and reports it as asked (`transaction_isolation`).
    ReadUncommitted,
    RepeatableRead,
    Serializable,
}

/// The answer to a committed transaction: one result per statement, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransactionResponse {
    pub results: Vec<StatementResult>,
    pub invalidation: InvalidationStatus,
    /// As `ExecuteResponse::position`: where the commit is, when the sidecar has replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatementResult {
    pub rows_affected: u64,
    /// Rows the statement returned (a SELECT, or RETURNING).
    #[serde(default)]
    pub rows: Vec<Row>,
}

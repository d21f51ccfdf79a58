//! A transaction being built: statements in order, options, invalidations, then
//! [`Transaction::run`].

use super::query::param;
use super::Ferry;
use crate::error::EdgeError;
use ferry_shared::api::{
    Invalidate, Isolation, TransactionRequest, TransactionResponse, TransactionStatement,
};
use serde::Serialize;

/// Statements that commit together or not at all (`/v1/transaction`).
pub struct Transaction {
    ferry: Ferry,
    req: TransactionRequest,
    error: Option<EdgeError>,
}

impl Transaction {
    pub(super) fn new(ferry: Ferry) -> Self {
        let req = TransactionRequest {
            identity: ferry.identity.clone(),
            ..Default::default()
        };
        Transaction {
            ferry,
            req,
            error: None,
        }
    }

    /// The statement named `name` in the sidecar's config, with its parameters.
    pub fn statement<P: Serialize>(mut self, name: &str, params: &[P]) -> Self {
        let params = params.iter().map(|p| param(&mut self.error, p)).collect();
        self.req.statements.push(TransactionStatement {
            query: Some(name.to_string()),
            sql: None,
            params,
        });
        self
    }

    /// The isolation level (read committed unless set).
    pub fn isolation(mut self, level: Isolation) -> Self {
        self.req.isolation = level;
        self
    }

    /// A read-only transaction: a statement that writes fails it.
    pub fn read_only(mut self) -> Self {
        self.req.read_only = true;
        self
    }

    /// After the commit, drop the entry cached under `key` (a read's `cache.key`).
    pub fn invalidate_key(mut self, key: impl Into<String>) -> Self {
        self.req
            .invalidate
            .get_or_insert_with(Invalidate::default)
            .keys
            .push(key.into());
        self
    }

    /// After the commit, drop every entry tagged `tag`.
    pub fn invalidate_tag(mut self, tag: impl Into<String>) -> Self {
        self.req
            .invalidate
            .get_or_insert_with(Invalidate::default)
            .tags
            .push(tag.into());
        self
    }

    /// The request as it will be sent.
    pub fn request(&self) -> &TransactionRequest {
        &self.req
    }

    /// Commits, then applies the invalidations; on failure nothing was committed and the
    /// error's body names the failing statement (`statement`). One error is the exception:
    /// [`EdgeError::CommittedWithoutResults`] (its answer was lost with its sidecar, and its
    /// outcome says it committed), whose position later reads still wait for.
    pub async fn run(self) -> Result<TransactionResponse, EdgeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        match self.ferry.calls.transaction(self.req).await {
            Ok(r) => {
                self.ferry.note(r.position);
                Ok(r)
            }
            Err(e) => {
                if let EdgeError::CommittedWithoutResults { position, .. } = &e {
                    self.ferry.note(*position);
                }
                Err(e)
            }
        }
    }
}

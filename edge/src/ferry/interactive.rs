//! An interactive transaction: statements sent one at a time, with the Worker's own logic
//! between them (read a row, decide, write), then committed, or rolled back. The transaction
//! lives in [`Begin::run`]'s closure: an `Ok` commits it, an `Err` rolls it back at once, so
//! no handler can leave one open to hold a pooled connection and its locks until the
//! sidecar's idle timeout.
//!
//! ```no_run
//! # async fn handler(ferry: ferry_edge::Ferry) -> Result<(), ferry_edge::EdgeError> {
//! #[derive(serde::Deserialize)]
//! struct Price { price: String }
//!
//! // Read under a row lock, decide in the Worker, write: no other writer slips in between.
//! let (old, _commit) = ferry.begin().run(|tx| async move {
//!     let p: Price = tx.statement("item_for_update").bind(7).fetch_one().await?;
//!     tx.statement("set_price").bind(7).bind("9.99").run().await?;
//!     tx.invalidate_key("items:7");
//!     Ok(p.price)
//! }).await?;
//! # Ok(()) }
//! ```

use super::query::{decode, param};
use super::Ferry;
use crate::error::EdgeError;
use ferry_shared::api::{
    BeginRequest, EndRequest, EndResponse, InTransactionRequest, Invalidate, Isolation,
    StatementResult,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

/// An interactive transaction about to begin: its options, then [`Begin::run`].
pub struct Begin {
    ferry: Ferry,
    req: BeginRequest,
}

impl Begin {
    pub(super) fn new(ferry: Ferry) -> Self {
        let req = BeginRequest {
            identity: ferry.identity.clone(),
            ..Default::default()
        };
        Begin { ferry, req }
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

    /// The request as it will be sent.
    pub fn request(&self) -> &BeginRequest {
        &self.req
    }

    /// Begins the transaction and runs `body` in it. When `body` answers `Ok`, the
    /// transaction is committed (then its invalidations applied), and its value comes back
    /// with the commit's answer; this handle's later reads carry the commit's position. When
    /// `body` answers `Err`, the transaction is rolled back before that error is returned. A
    /// commit whose answer was lost is settled by its outcome (`crate::outcome`).
    pub async fn run<T, F, Fut>(self, body: F) -> Result<(T, EndResponse), EdgeError>
    where
        F: FnOnce(Tx) -> Fut,
        Fut: Future<Output = Result<T, EdgeError>>,
    {
        let begun = self.ferry.calls.begin(self.req).await?;
        let tx = Tx(Rc::new(Open {
            ferry: self.ferry.clone(),
            id: begun.id,
            invalidate: RefCell::default(),
        }));
        let end = EndRequest {
            id: tx.0.id.clone(),
            invalidate: None,
            identity: self.ferry.identity.clone(),
        };
        match body(tx.clone()).await {
            Ok(value) => {
                let invalidate = tx.0.invalidate.take();
                let has_any = !(invalidate.keys.is_empty() && invalidate.tags.is_empty());
                let end = EndRequest {
                    invalidate: has_any.then_some(invalidate),
                    ..end
                };
                let r = self.ferry.calls.commit(end).await?;
                self.ferry.note(r.position);
                Ok((value, r))
            }
            Err(e) => {
                // Its connection and locks go back now, not at the idle timeout. Should the
                // rollback fail, the sidecar still rolls it back at that timeout.
                let _ = self.ferry.calls.rollback(end).await;
                Err(e)
            }
        }
    }
}

/// The open transaction, inside [`Begin::run`]'s closure. Cheap to clone.
#[derive(Clone)]
pub struct Tx(Rc<Open>);

struct Open {
    ferry: Ferry,
    id: String,
    /// What the commit invalidates.
    invalidate: RefCell<Invalidate>,
}

impl Tx {
    /// The statement named `name` in the sidecar's config, to run in this transaction.
    pub fn statement(&self, name: &str) -> TxStatement {
        TxStatement {
            tx: self.clone(),
            req: InTransactionRequest {
                id: self.0.id.clone(),
                query: Some(name.to_string()),
                identity: self.0.ferry.identity.clone(),
                ..Default::default()
            },
            error: None,
        }
    }

    /// After the commit, drop the entry cached under `key`.
    pub fn invalidate_key(&self, key: impl Into<String>) {
        self.0.invalidate.borrow_mut().keys.push(key.into());
    }

    /// After the commit, drop every entry tagged `tag`.
    pub fn invalidate_tag(&self, tag: impl Into<String>) {
        self.0.invalidate.borrow_mut().tags.push(tag.into());
    }
}

/// One statement of an open transaction: parameters, then `run` or a `fetch`.
pub struct TxStatement {
    tx: Tx,
    req: InTransactionRequest,
    error: Option<EdgeError>,
}

impl TxStatement {
    /// The next positional parameter (`$1`, `$2`...).
    pub fn bind(mut self, value: impl Serialize) -> Self {
        let v = param(&mut self.error, value);
        self.req.params.push(v);
        self
    }

    /// The request as it will be sent.
    pub fn request(&self) -> &InTransactionRequest {
        &self.req
    }

    /// The sidecar's answer: rows affected, and the rows returned. A failed statement
    /// aborts the transaction (as in Postgres): return its error from the closure.
    pub async fn result(self) -> Result<StatementResult, EdgeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.tx.0.ferry.calls.in_transaction(self.req).await
    }

    /// Runs it: the rows it affected.
    pub async fn run(self) -> Result<u64, EdgeError> {
        Ok(self.result().await?.rows_affected)
    }

    /// Every row it returned, as `T`.
    pub async fn fetch_all<T: DeserializeOwned>(self) -> Result<Vec<T>, EdgeError> {
        self.result().await?.rows.into_iter().map(decode).collect()
    }

    /// The first row as `T`; no row is 404 `not_found` (which, returned, rolls back).
    pub async fn fetch_one<T: DeserializeOwned>(self) -> Result<T, EdgeError> {
        let first = self.result().await?.rows.into_iter().next();
        first
            .map(decode)
            .transpose()?
            .ok_or_else(|| EdgeError::NotFound("no row".into()))
    }
}

#[cfg(test)]
#[path = "interactive_tests.rs"]
mod tests;

//! The library a Worker uses to reach Ferry: one [`Ferry`] per request, built from the Worker's
//! bindings, with typed reads, writes and the end user they run as.
//!
//! ```no_run
//! # async fn handler(ferry: ferry_edge::Ferry) -> Result<(), ferry_edge::EdgeError> {
//! #[derive(serde::Deserialize)]
//! struct Item { id: i32, name: String }
//!
//! // A named statement from the sidecar's config, cached 60 s under its own key.
//! let item: Option<Item> = ferry.query("item").bind(7).cache(60).key("items:7")
//!     .fetch_optional().await?;
//! // Reads issued together go to the sidecar as one call.
//! let (a, b) = futures::join!(
//!     ferry.query("item").bind(1).fetch_optional::<Item>(),
//!     ferry.query("item").bind(2).fetch_optional::<Item>(),
//! );
//! // A write, then the entries it made stale, before it returns.
//! ferry.execute("upsert_item").bind(7).bind("lamp").bind("12.50")
//!     .invalidate_key("items:7").run().await?;
//! # Ok(()) }
//! ```
//!
//! Every failure is an [`EdgeError`], which knows its HTTP status and JSON body, so a handler
//! can answer with it as it is.

mod batch;
mod interactive;
mod offline;
mod position;
mod query;
mod transaction;

pub use batch::{Batcher, Transport, MAX_BATCH};
pub use interactive::{Begin, Tx, TxStatement};
pub use position::{
    position_cookie, position_from_cookies, POSITION_COOKIE, POSITION_COOKIE_MAX_AGE_S,
};
pub use query::{Execute, Query};
pub use transaction::Transaction;

use crate::error::EdgeError;
use ferry_shared::api::{
    BeginRequest, BeginResponse, CacheCommand, CacheReply, EndRequest, EndResponse, ExecuteRequest,
    ExecuteResponse, Identity, InTransactionRequest, KeyedRequest, KeyedResponse, Position,
    QueryRequest, Readiness, StatementResult, TransactionRequest, TransactionResponse,
};
use futures_util::future::LocalBoxFuture;
use serde::Serialize;
use std::cell::Cell;
use std::rc::Rc;

/// The sidecar calls other than reads: the signed HTTP client on wasm32, a fake in tests.
pub trait Calls {
    /// `POST /v1/execute`.
    fn execute(
        &self,
        write: ExecuteRequest,
    ) -> LocalBoxFuture<'_, Result<ExecuteResponse, EdgeError>>;
    /// `POST /v1/batch/keyed`.
    fn keyed(&self, read: KeyedRequest) -> LocalBoxFuture<'_, Result<KeyedResponse, EdgeError>>;
    /// `POST /v1/cache`.
    fn cache(&self, command: CacheCommand) -> LocalBoxFuture<'_, Result<CacheReply, EdgeError>>;
    /// `POST /v1/transaction`.
    fn transaction(
        &self,
        tx: TransactionRequest,
    ) -> LocalBoxFuture<'_, Result<TransactionResponse, EdgeError>>;
    /// `GET /readyz`.
    fn readiness(&self) -> LocalBoxFuture<'_, Result<Readiness, EdgeError>>;
    /// `POST /v1/transaction/begin`. The interactive calls answer "not here" unless a
    /// transport has them (the Worker's does; most test fakes need not).
    fn begin(&self, _: BeginRequest) -> LocalBoxFuture<'_, Result<BeginResponse, EdgeError>> {
        not_here()
    }
    /// `POST /v1/transaction/query`.
    fn in_transaction(
        &self,
        _: InTransactionRequest,
    ) -> LocalBoxFuture<'_, Result<StatementResult, EdgeError>> {
        not_here()
    }
    /// `POST /v1/transaction/commit`.
    fn commit(&self, _: EndRequest) -> LocalBoxFuture<'_, Result<EndResponse, EdgeError>> {
        not_here()
    }
    /// `POST /v1/transaction/rollback`.
    fn rollback(&self, _: EndRequest) -> LocalBoxFuture<'_, Result<EndResponse, EdgeError>> {
        not_here()
    }
}

fn not_here<T>() -> LocalBoxFuture<'static, Result<T, EdgeError>> {
    Box::pin(async {
        Err(EdgeError::Misconfigured(
            "this transport has no interactive transactions".into(),
        ))
    })
}

/// One request's handle on the sidecar. Cheap to clone; clones share one batch queue.
#[derive(Clone)]
pub struct Ferry {
    reads: Rc<Batcher>,
    calls: Rc<dyn Calls>,
    identity: Option<Identity>,
    /// Who sent an anonymous request (their address): the sidecar's anonymous budget counts
    /// it ([`Ferry::anonymous`]).
    caller: Option<String>,
    /// The latest position a write of this request returned (or [`Ferry::after`] gave): every
    /// read sent later carries it, so it sees those writes (read-your-writes).
    position: Rc<Cell<Option<Position>>>,
}

impl Ferry {
    /// A handle over any transport (the Worker's is built by [`Ferry::from_env`]).
    /// `batching: false` sends every read on its own.
    pub fn with_transport(
        reads: Box<dyn Transport>,
        calls: Rc<dyn Calls>,
        batching: bool,
    ) -> Ferry {
        Ferry {
            reads: Rc::new(Batcher::new(reads, batching)),
            calls,
            identity: None,
            caller: None,
            position: Rc::default(),
        }
    }

    /// The same handle, for a request from an anonymous caller (`caller`: their address, e.g.
    /// the `CF-Connecting-IP` header): the sidecar counts its reads against that caller's
    /// budget and that of all anonymous callers (`limits.anonymous_*`), and answers 429 with
    /// Retry-After past either. A handle [`Ferry::as_user`] has made counts against its user.
    pub fn anonymous(self, caller: &str) -> Ferry {
        Ferry {
            caller: Some(caller.to_string()),
            ..self
        }
    }

    /// Reads sent from now on see every write up to `position` (one an earlier request's write
    /// returned, say from [`position_from_cookies`]); a later position already held stays.
    pub fn after(self, position: Option<Position>) -> Ferry {
        self.note(position);
        self
    }

    /// The position this request's reads carry: the latest a write returned, if any. Pass it
    /// to the next request (see [`position_cookie`]) to read these writes there too.
    pub fn position(&self) -> Option<Position> {
        self.position.get()
    }

    fn note(&self, position: Option<Position>) {
        if position > self.position.get() {
            self.position.set(position);
        }
    }

    /// The same handle, running every statement as this end user (see
    /// `ferry_edge::access::end_user` for one from a verified JWT): the sidecar applies
    /// Postgres's row-level security to them and keeps their cache entries apart.
    pub fn as_user(&self, identity: Identity) -> Ferry {
        Ferry {
            identity: Some(identity),
            ..self.clone()
        }
    }

    /// A read of the statement named `name` in the sidecar's config (`[queries.NAME]`).
    pub fn query(&self, name: &str) -> Query {
        self.read(QueryRequest {
            query: Some(name.to_string()),
            ..Default::default()
        })
    }

    /// A read of raw SQL (the sidecar must allow it: `auth.allow_raw_sql`).
    pub fn sql(&self, sql: &str) -> Query {
        self.read(QueryRequest {
            sql: Some(sql.to_string()),
            ..Default::default()
        })
    }

    fn read(&self, mut req: QueryRequest) -> Query {
        req.identity = self.identity.clone();
        req.caller = self.caller.clone();
        Query {
            ferry: self.clone(),
            req,
            error: None,
        }
    }

    /// A write of the statement named `name` in the sidecar's config.
    pub fn execute(&self, name: &str) -> Execute {
        Execute {
            ferry: self.clone(),
            req: ExecuteRequest {
                query: Some(name.to_string()),
                identity: self.identity.clone(),
                ..Default::default()
            },
            error: None,
        }
    }

    /// Statements in one transaction, all committed or none (as this handle's user, if any).
    pub fn transaction(&self) -> Transaction {
        Transaction::new(self.clone())
    }

    /// An interactive transaction (as this handle's user, if any): statements one at a time,
    /// with the Worker's logic between them, in [`Begin::run`]'s closure.
    pub fn begin(&self) -> Begin {
        Begin::new(self.clone())
    }

    /// Rows of a keyspace (`[keyspaces.NAME]` in the sidecar's config) by id, in one call:
    /// hits from Redis, the rest from one Postgres query.
    pub async fn keyed(
        &self,
        keyspace: &str,
        ids: &[impl Serialize],
    ) -> Result<KeyedResponse, EdgeError> {
        let mut error = None;
        let ids = ids.iter().map(|id| query::param(&mut error, id)).collect();
        if let Some(e) = error {
            return Err(e);
        }
        self.calls
            .keyed(KeyedRequest {
                keyspace: keyspace.to_string(),
                ids,
                caller: self.caller.clone(),
            })
            .await
    }

    /// A plain cache command (`GET`, `SET`, `DEL`... on the sidecar's plain keys).
    pub async fn cache(&self, command: CacheCommand) -> Result<CacheReply, EdgeError> {
        self.calls.cache(command).await
    }

    /// The sidecar's readiness (its background snapshot: never touches its pools).
    pub async fn readiness(&self) -> Result<Readiness, EdgeError> {
        self.calls.readiness().await
    }

    /// The end user this handle runs as, if any.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// How many calls this request's reads have made to the sidecar so far.
    pub fn sidecar_calls(&self) -> u32 {
        self.reads.calls()
    }
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(target_arch = "wasm32")]
mod user;
#[cfg(target_arch = "wasm32")]
mod worker_env;

#[cfg(target_arch = "wasm32")]
pub use user::{end_user, KEYS_TTL_S, REFETCH_MIN_S};

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

pub use batch::{Batcher, Transport, MAX_BATCH};

use crate::error::EdgeError;
use ferry_shared::api::{
    CachePolicy, ExecuteRequest, ExecuteResponse, Identity, Invalidate, QueryRequest,
    QueryResponse, Row,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::rc::Rc;

/// Runs writes: the signed HTTP client on wasm32, a fake in tests.
pub trait Writer {
    fn execute(
        &self,
        write: ExecuteRequest,
    ) -> futures_util::future::LocalBoxFuture<'_, Result<ExecuteResponse, EdgeError>>;
}

/// One request's handle on the sidecar. Cheap to clone; clones share one batch queue.
#[derive(Clone)]
pub struct Ferry {
    reads: Rc<Batcher>,
    writes: Rc<dyn Writer>,
    identity: Option<Identity>,
}

impl Ferry {
    /// A handle over any transport (the Worker's is built by [`Ferry::from_env`]).
    /// `batching: false` sends every read on its own.
    pub fn with_transport(
        reads: Box<dyn Transport>,
        writes: Rc<dyn Writer>,
        batching: bool,
    ) -> Ferry {
        Ferry {
            reads: Rc::new(Batcher::new(reads, batching)),
            writes,
            identity: None,
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

    /// The end user this handle runs as, if any.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// How many calls this request's reads have made to the sidecar so far.
    pub fn sidecar_calls(&self) -> u32 {
        self.reads.calls()
    }
}

/// Turns a parameter into JSON, remembering the first that could not be.
fn param(error: &mut Option<EdgeError>, value: impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| {
        error.get_or_insert(EdgeError::bad_request(format!(
            "a parameter cannot be sent: {e}"
        )));
        Value::Null
    })
}

/// A read being built: parameters, then the cache policy, then one of the `fetch` calls.
pub struct Query {
    ferry: Ferry,
    req: QueryRequest,
    error: Option<EdgeError>,
}

impl Query {
    /// The next positional parameter (`$1`, `$2`...).
    pub fn bind(mut self, value: impl Serialize) -> Self {
        let v = param(&mut self.error, value);
        self.req.params.push(v);
        self
    }

    /// Read through the cache, fresh for `ttl_s` seconds.
    pub fn cache(mut self, ttl_s: u64) -> Self {
        self.policy().ttl_s = Some(ttl_s);
        self
    }

    /// Name the cache entry, so a write can invalidate it by name.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.policy().key = Some(key.into());
        self
    }

    /// Tag the cache entry, so a write can invalidate every entry with the tag.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.policy().tags.push(tag.into());
        self
    }

    /// A table the result depends on: any committed change to it drops the entry (with the
    /// sidecar's change stream on).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.policy().tables.push(table.into());
        self
    }

    fn policy(&mut self) -> &mut CachePolicy {
        self.req.cache.get_or_insert_with(CachePolicy::default)
    }

    /// The request as it will be sent.
    pub fn request(&self) -> &QueryRequest {
        &self.req
    }

    /// The sidecar's whole answer: rows, and where they came from (`cache`, `age_ms`).
    pub async fn response(self) -> Result<QueryResponse, EdgeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.ferry.reads.read(self.req).await
    }

    /// Every row, as `T`.
    pub async fn fetch_all<T: DeserializeOwned>(self) -> Result<Vec<T>, EdgeError> {
        let rows = self.response().await?.rows;
        rows.into_iter().map(decode).collect()
    }

    /// The first row as `T`, or None when there is none.
    pub async fn fetch_optional<T: DeserializeOwned>(self) -> Result<Option<T>, EdgeError> {
        let rows = self.response().await?.rows;
        rows.into_iter().next().map(decode).transpose()
    }

    /// The first row as `T`; no row is 404 `not_found`.
    pub async fn fetch_one<T: DeserializeOwned>(self) -> Result<T, EdgeError> {
        self.fetch_optional()
            .await?
            .ok_or_else(|| EdgeError::NotFound("no row".into()))
    }
}

/// A row as the caller's type: a mismatch is the Worker's bug, reported without the row.
fn decode<T: DeserializeOwned>(row: Row) -> Result<T, EdgeError> {
    serde_json::from_value(Value::Object(row.into_iter().collect()))
        .map_err(|e| EdgeError::Misconfigured(format!("a row does not fit the Worker's type: {e}")))
}

/// A write being built: parameters, what it invalidates, then [`Execute::run`].
pub struct Execute {
    ferry: Ferry,
    req: ExecuteRequest,
    error: Option<EdgeError>,
}

impl Execute {
    /// The next positional parameter (`$1`, `$2`...).
    pub fn bind(mut self, value: impl Serialize) -> Self {
        let v = param(&mut self.error, value);
        self.req.params.push(v);
        self
    }

    fn invalidate(&mut self) -> &mut Invalidate {
        self.req.invalidate.get_or_insert_with(Invalidate::default)
    }

    /// After the commit, drop the entry named `key`.
    pub fn invalidate_key(mut self, key: impl Into<String>) -> Self {
        self.invalidate().keys.push(key.into());
        self
    }

    /// After the commit, drop every entry tagged `tag`.
    pub fn invalidate_tag(mut self, tag: impl Into<String>) -> Self {
        self.invalidate().tags.push(tag.into());
        self
    }

    /// The request as it will be sent.
    pub fn request(&self) -> &ExecuteRequest {
        &self.req
    }

    /// Commits the write and applies its invalidations, then answers.
    pub async fn run(self) -> Result<ExecuteResponse, EdgeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.ferry.writes.execute(self.req).await
    }
}

#[cfg(target_arch = "wasm32")]
mod user;
#[cfg(target_arch = "wasm32")]
mod worker_env;

#[cfg(target_arch = "wasm32")]
pub use user::{end_user, KEYS_TTL_S, REFETCH_MIN_S};

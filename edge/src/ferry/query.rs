//! The read and write builders: parameters, cache policy and invalidations, then the call.

use super::Ferry;
use crate::error::EdgeError;
use ferry_shared::api::{
    CachePolicy, ExecuteRequest, ExecuteResponse, Invalidate, QueryRequest, QueryResponse, Row,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Turns a parameter into JSON, remembering the first that could not be.
pub(super) fn param(error: &mut Option<EdgeError>, value: impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| {
        error.get_or_insert(EdgeError::bad_request(format!(
            "a parameter cannot be sent: {e}"
        )));
        Value::Null
    })
}

/// A read being built: parameters, then the cache policy, then one of the `fetch` calls.
pub struct Query {
    pub(super) ferry: Ferry,
    pub(super) req: QueryRequest,
    pub(super) error: Option<EdgeError>,
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
    pub async fn response(mut self) -> Result<QueryResponse, EdgeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        // As late as possible: a write that finished after this read was built counts too.
        if self.req.after.is_none() {
            self.req.after = self.ferry.position();
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
pub(super) fn decode<T: DeserializeOwned>(row: Row) -> Result<T, EdgeError> {
    serde_json::from_value(Value::Object(row.into_iter().collect()))
        .map_err(|e| EdgeError::Misconfigured(format!("a row does not fit the Worker's type: {e}")))
}

/// A write being built: parameters, what it invalidates, then [`Execute::run`].
pub struct Execute {
    pub(super) ferry: Ferry,
    pub(super) req: ExecuteRequest,
    pub(super) error: Option<EdgeError>,
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

    /// Commits the write and applies its invalidations, then answers. This handle's later
    /// reads carry the write's position.
    pub async fn run(self) -> Result<ExecuteResponse, EdgeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let r = self.ferry.calls.execute(self.req).await?;
        self.ferry.note(r.position);
        Ok(r)
    }
}

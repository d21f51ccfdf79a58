//! Request and response bodies of the `/v1` endpoints (JSON).
//!
//! Requests refuse unknown fields: a field this sidecar does not know would otherwise be
//! silently ignored, and a caller asking for a behaviour it does not get is worse than a 400.
//! Responses may gain fields within `/v1`; clients must ignore fields they do not know.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::cache::{CacheCommand, CacheEntry, CacheReply};
pub use crate::identity::Identity;
pub use crate::position::Position;
pub use crate::transaction::{
    BeginRequest, BeginResponse, EndRequest, EndResponse, InTransactionRequest, Isolation,
    StatementResult, TransactionRequest, TransactionResponse, TransactionStatement,
};

/// The header that carries a request's id from the edge through the sidecar and back.
pub const REQUEST_ID_HEADER: &str = "x-ferry-request-id";

/// Not signed, not read by the sidecar: a balancer routes requests that carry the same value
/// to the same sidecar, which interactive transactions need (they live on the sidecar that
/// began them; see deploy/nginx/ferry-balancer.conf).
pub const AFFINITY_HEADER: &str = "x-ferry-affinity";

/// Whether a caller's request id may be kept (logged and echoed): 1 to 64 characters of
/// `[A-Za-z0-9_-]`. Both halves apply this one rule.
pub fn valid_request_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Paths of the v1 endpoints.
pub mod paths {
    pub const QUERY: &str = "/v1/query";
    pub const EXECUTE: &str = "/v1/execute";
    pub const CACHE: &str = "/v1/cache";
    pub const BATCH: &str = "/v1/batch";
    pub const BATCH_KEYED: &str = "/v1/batch/keyed";
    pub const OUTCOME: &str = "/v1/outcome";
    pub const TRANSACTION: &str = "/v1/transaction";
    pub const TRANSACTION_BEGIN: &str = "/v1/transaction/begin";
    pub const TRANSACTION_QUERY: &str = "/v1/transaction/query";
    pub const TRANSACTION_COMMIT: &str = "/v1/transaction/commit";
    pub const TRANSACTION_ROLLBACK: &str = "/v1/transaction/rollback";
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
}

/// `POST /v1/query`: a read, optionally through the cache. Exactly one of `sql` (raw SQL, if
/// the deployment allows it) and `query` (a statement named in the sidecar's config).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// The name of a statement in the sidecar's `[queries.NAME]` config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Positional parameters `$1..$n`, bound to the types Postgres infers for them.
    #[serde(default)]
    pub params: Vec<Value>,
    /// Absent: straight to Postgres (`"cache": "bypass"`), unless a named query has a cache
    /// policy in config. Fields given here override the named query's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CachePolicy>,
    /// The end user this read runs as (see [`Identity`]). Absent: the sidecar's own role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
    /// A `position` a write returned: the read is served only by a replica that has replayed
    /// past it, or by the primary (read-your-writes). Absent: see `replicas.reads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Position>,
    /// Who sent an anonymous request, as the edge knows them (their address): the sidecar's
    /// anonymous budget counts it (`limits.anonymous_*`). Ignored with an `identity`, whose
    /// own rate applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
}

impl QueryRequest {
    /// A raw-SQL read.
    pub fn sql(sql: impl Into<String>, params: Vec<Value>) -> Self {
        QueryRequest {
            sql: Some(sql.into()),
            params,
            ..Default::default()
        }
    }
}

/// How a read uses the cache.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachePolicy {
    /// Time to live of the cached result, in seconds (at least 1). Required unless the named
    /// query gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// A name for the entry, so a write can invalidate it by name (`"item:42"`). Absent: the
    /// entry is named by a hash of the statement and its parameters (returned as `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Stale-while-revalidate: for this many seconds after the TTL, serve the old rows at once
    /// (`"cache": "stale"`) and refresh them in the background, once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swr_s: Option<u64>,
    /// Stale-if-error: keep the rows this many seconds past the TTL, and serve them (marked
    /// stale, with the error) when Postgres fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_if_error_s: Option<u64>,
    /// Tags to invalidate this entry by (`/v1/execute` `invalidate.tags`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Tables the result depends on (`"items"`, `"shop.orders"`): where the sidecar watches
    /// Postgres's change stream, any committed change to them drops this entry, whoever wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
    /// With no `tables` and no `key`, where the sidecar watches Postgres's change stream, the
    /// tables are inferred from Postgres's own parse of the statement, and a read that could
    /// not stay fresh is not cached (`bypass_reason` says why). `false`: no inference; the
    /// entry lives until its TTL or an invalidation by tag (writes from outside Ferry are not
    /// seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer: Option<bool>,
    #[serde(default, skip_serializing_if = "CacheMode::is_default")]
    pub mode: CacheMode,
}

/// Per-request freshness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheMode {
    /// Use the cache as the policy says.
    #[default]
    Default,
    /// Skip the lookup, read Postgres, refresh the entry.
    NoCache,
    /// Answer only from the cache; never touch Postgres (a miss is 404 `not_cached`).
    OnlyIfCached,
}

impl CacheMode {
    pub fn is_default(&self) -> bool {
        *self == CacheMode::Default
    }
}

/// Where a read's rows came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheStatus {
    /// Served from Redis; Postgres was not touched.
    Hit,
    /// Not in Redis: run on Postgres and written back with the TTL.
    Miss,
    /// The cache was not used: no cache policy, Redis unavailable, or a result too large to cache.
    Bypass,
    /// Served from Redis past its TTL: see `stale_reason`.
    Stale,
}

/// Why stale rows were served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleReason {
    /// Within `swr_s`: a background refresh was started (or is running).
    Revalidating,
    /// Postgres failed (`upstream_error` says how) and `stale_if_error_s` allowed the old rows.
    Error,
}

/// One result row: column name to JSON value.
pub type Row = Map<String, Value>;

/// A read's answer. `R` is how its rows are held: parsed (`Vec<Row>`, what clients get) or,
/// in the sidecar, as the JSON text of a cache entry, copied from Redis to the response
/// without being decoded and encoded again. The wire shape is the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryResponse<R = Vec<Row>> {
    pub rows: R,
    pub cache: CacheStatus,
    /// Age of the rows in milliseconds: 0 when just read from Postgres.
    pub age_ms: u64,
    /// The entry's cache key (what `invalidate.keys` takes), when the cache was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Set when `cache` is `stale`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_reason: Option<StaleReason>,
    /// With `stale_reason: error`: the error Postgres gave, which the stale rows stand in for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_error: Option<crate::ErrorCode>,
    /// Why a read whose tables were to be inferred was not cached (`cache: bypass`): what it
    /// calls or reads that the change stream cannot keep fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bypass_reason: Option<String>,
}

/// `POST /v1/execute`: a write, then cache invalidation. Exactly one of `sql` and `query`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// The name of a statement in the sidecar's `[queries.NAME]` config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default)]
    pub params: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidate: Option<Invalidate>,
    /// The end user this write runs as (see [`Identity`]). Absent: the sidecar's own role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
}

/// Cache entries to drop after a write commits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invalidate {
    /// Query cache keys: a `cache.key` given on reads, or the `key` a read returned.
    #[serde(default)]
    pub keys: Vec<String>,
    /// Tags: every entry read with one of these tags is invalidated.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Tables: every entry that depends on one (`cache.tables`), and the keyspace rows read
    /// from it, at once (without waiting for the change stream).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
}

/// What happened to the invalidation a write asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidationStatus {
    /// Nothing was asked.
    None,
    /// The entries are gone from Redis.
    Done,
    /// Redis was unavailable: the sidecar holds the keys and deletes them as soon as Redis is
    /// back; until then it serves no read from the cache, so no read sees the old value.
    Deferred,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteResponse {
    pub rows_affected: u64,
    pub invalidation: InvalidationStatus,
    /// Where the write's commit is in Postgres's log, when the sidecar has replicas or the change
    /// stream on: pass it as a later read's `after` to read this write back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
}

/// `POST /v1/outcome`: whether the write sent with this nonce committed, asked when no answer
/// came back for it (its sidecar died). A write that had not committed never will after this.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeRequest {
    /// The `x-ferry-nonce` header the write was signed with.
    pub nonce: String,
    /// The write's own invalidations: applied (again) when it committed, since its sidecar may
    /// have died before it applied them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidate: Option<Invalidate>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutcomeResponse {
    pub committed: bool,
    /// With `committed`: the rows the write affected (all statements, for a transaction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_affected: Option<u64>,
    pub invalidation: InvalidationStatus,
    /// With `committed`, as `ExecuteResponse::position`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
}

/// `POST /v1/batch`: many reads in one call, answered in order, each on its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    pub reads: Vec<QueryRequest>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchResponse<R = Vec<Row>> {
    pub results: Vec<BatchResult<R>>,
}

/// One read's outcome: `{"ok": {...}}` or `{"error": {...}}`; one failing read does not fail
/// the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchResult<R = Vec<Row>> {
    Ok(QueryResponse<R>),
    Error(crate::error::ErrorDetail),
}

/// `POST /v1/batch/keyed`: rows of a keyspace (`[keyspaces.NAME]` in the sidecar's config) by
/// id: one Redis MGET, the misses filled by one Postgres query, written back in one pipeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyedRequest {
    pub keyspace: String,
    /// Key column values (numbers or strings). Duplicates are answered twice, looked up once.
    pub ids: Vec<Value>,
    /// Who sent it, when anonymous (see [`QueryRequest::caller`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyedResponse {
    /// One per requested id, in request order.
    pub results: Vec<KeyedResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyedResult {
    pub id: Value,
    pub status: KeyedStatus,
    /// The row; null when `not_found`.
    pub row: Option<Row>,
    /// Age of the row in milliseconds (0 when just read from Postgres).
    pub age_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyedStatus {
    Hit,
    Miss,
    /// Postgres has no row with this id (not cached: a later insert is seen at once).
    NotFound,
    /// Redis was unavailable (or the row too large to cache): read from Postgres.
    Bypass,
}

/// `GET /readyz`: each dependency's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    pub redis: DependencyState,
    pub postgres: DependencyState,
    /// Invalidations waiting for Redis (the whole cache counts as one once their bound is
    /// passed). While any wait, reads bypass Redis (`cache_bypassed`).
    #[serde(default)]
    pub pending_invalidations: u64,
    #[serde(default)]
    pub cache_bypassed: bool,
    /// The change stream, when the sidecar watches one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<ChangesReadiness>,
}

/// `/readyz`'s view of change-stream invalidation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesReadiness {
    /// `caught_up` (cached reads served), `catching_up` (replaying what this sidecar missed:
    /// reads bypass the cache), `lagging` (invalidations trail commits by more than
    /// `changes.max_lag_ms`: reads bypass).
    pub state: String,
    /// This sidecar's part: `leader` (consumes the slot), `follower`, `starting`.
    pub role: String,
    /// Age of the stream's watermark, in milliseconds (absent before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DependencyState {
    Up,
    Down,
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;

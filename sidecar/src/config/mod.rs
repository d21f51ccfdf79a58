//! Configuration: one TOML file (every key optional, defaults below), then environment overrides.
//!
//! Every key `section.key` can be set with `FERRY_SECTION_KEY` (e.g. `redis.pool_size` with
//! `FERRY_REDIS_POOL_SIZE`). Four short aliases let the binary run with no file at all:
//! `FERRY_LISTEN`, `FERRY_REDIS_URL`, `FERRY_DATABASE_URL`, `FERRY_SECRET`.
//! `deploy/ferry.toml` is the commented sample; keep it in step with this file.
//!
//! Here: the types and their defaults (`queries.rs`: named queries and keyspaces). `load.rs`: file and environment. `validate.rs`: the
//! rules each key must keep. `secret.rs`: secrets that never print. `limits.rs`: the request
//! bounds every handler checks with.

mod changes;
mod identity;
mod limits;
mod load;
mod neon;
mod queries;
mod redis;
mod reload;
mod replicas;
mod secret;
mod upstash;
mod validate;

pub use changes::{table_name, ChangesConfig};
pub use identity::{IdentityConfig, MAX_CLAIMS_BYTES};
pub use limits::{Limits, ReadLimits, MAX_TAGS};
pub use load::ConfigError;
pub use neon::{NeonConfig, NeonToken};
pub use queries::{Keyspace, NamedQuery};
pub use redis::RedisConfig;
pub use reload::{reload, Reloaded};
pub use replicas::{ReplicaReads, ReplicasConfig};
pub use secret::{Redacted, RedactedUrl};
pub use upstash::{UpstashConfig, UpstashToken};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub redis: RedisConfig,
    pub postgres: PostgresConfig,
    pub replicas: ReplicasConfig,
    pub cache: CacheConfig,
    pub limits: LimitsConfig,
    pub changes: ChangesConfig,
    pub upstash: UpstashConfig,
    pub neon: NeonConfig,
    pub identity: IdentityConfig,
    /// Named statements: `[queries.NAME]`. Callers send `"query": "NAME"` instead of SQL.
    pub queries: BTreeMap<String, NamedQuery>,
    /// Keyspaces for keyed batch reads: `[keyspaces.NAME]`.
    pub keyspaces: BTreeMap<String, Keyspace>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// host:port to listen on.
    pub listen: String,
    /// actix worker threads; 0 = one per core.
    pub workers: usize,
    /// Largest request body accepted, in bytes (larger: 413).
    pub body_limit_bytes: usize,
    /// Whole-request deadline for work on Redis/Postgres, in milliseconds (beyond: 504).
    pub request_timeout_ms: u64,
    /// Requests doing Redis/Postgres work at once; beyond this, 503 at once (not queued).
    pub max_in_flight: usize,
    /// Seconds a client is told to wait in `Retry-After` on a 503.
    pub retry_after_s: u64,
    /// Seconds in-flight requests get to finish after SIGTERM.
    pub shutdown_timeout_s: u64,
    /// Log format: "text" or "json".
    pub log_format: String,
    /// Log level or tracing filter ("info", "debug", "ferry=debug,info"); FERRY_LOG wins
    /// when set. Reloadable (SIGHUP).
    pub log_level: String,
    /// How often /readyz's snapshot of Redis and Postgres is refreshed, in milliseconds.
    pub readiness_interval_ms: u64,
    /// host:port of the admin listener (GET /metrics, /healthz); keep it on localhost or a
    /// private network. Empty: no admin listener.
    pub admin_listen: String,
    /// PEM certificate chain for HTTPS on `listen`; with `tls_key_path`. Empty: plain HTTP
    /// (then put a TLS proxy in front).
    pub tls_cert_path: String,
    /// PEM private key for HTTPS.
    pub tls_key_path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The shared HMAC secret (prefer `secret_file` or the FERRY_SECRET variable).
    pub secret: Redacted<String>,
    /// A file holding the secret (trailing newline ignored); wins over `secret` when set.
    pub secret_file: String,
    /// Allowed clock difference between signer and sidecar, in seconds.
    pub max_skew_s: u64,
    /// Whether callers may send raw SQL; false: only `[queries.NAME]` statements (raw: 403).
    pub allow_raw_sql: bool,
    /// During a secret rotation: the old secret, still accepted alongside `secret`. Empty: none.
    pub previous_secret: Redacted<String>,
    /// Where nonces are remembered: `shared` (in Redis and, for writes, in Postgres, so a
    /// request one sidecar accepted is refused by every other) or `local` (this process only:
    /// safe with one sidecar, never behind a balancer).
    pub replay: ReplayScope,
    /// The Postgres table of writes' nonces with `replay = "shared"` (`schema.table`; created if
    /// missing, when the login role may).
    pub nonce_table: String,
}

/// `auth.replay`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ReplayScope {
    Shared,
    Local,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// libpq-style URL: postgres://user:password@host:port/db[?sslmode=require].
    pub url: RedactedUrl,
    /// PEM CA certificate(s) to trust for TLS (a private CA); empty: the system's roots.
    pub tls_ca_path: String,
    /// A file holding the database password; wins over a password in `url` when set.
    pub password_file: String,
    /// Most connections the pool ever opens.
    pub pool_size: u32,
    /// Idle connections kept open.
    pub min_idle: u32,
    /// Longest wait for a pooled connection, in milliseconds (beyond: 503).
    pub checkout_timeout_ms: u64,
    /// TCP connect timeout for a new connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Server-side statement_timeout, in milliseconds (0 = none).
    pub statement_timeout_ms: u64,
    /// Ferry's own role: it owns the schema of Ferry's bookkeeping (write outcomes and replay
    /// nonces, `auth.nonce_table`; deferred invalidations, `cache.deferred_table`), and no
    /// request ever runs as it. Its own login, never `url`'s. Empty: only with `single_role`.
    pub owner_url: RedactedUrl,
    /// Requests and Ferry's bookkeeping share `url`'s role (no `owner_url`). Unsafe: SQL a
    /// caller sends can then forge write outcomes, refuse others' writes as replays and flush
    /// the cache (RELIABILITY.md, "Who can do what"). For one trusted application only.
    pub single_role: bool,
    /// The password read from `password_file` (never serialized, never logged).
    #[serde(skip)]
    pub password: Option<Redacted<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Prefix of every Redis key Ferry writes, so several apps can share one Redis.
    pub key_prefix: String,
    /// Largest TTL a request may ask for, in seconds.
    pub max_ttl_s: u64,
    /// Longest caller-chosen key, in bytes.
    pub max_key_bytes: usize,
    /// How often pending invalidations are retried while Redis is down, in milliseconds.
    pub invalidation_retry_ms: u64,
    /// The Postgres table deferred invalidations are also kept in, so they outlive the sidecar
    /// that deferred them and any sidecar applies them (`schema.table`; created if missing,
    /// when the login role may). Empty: memory only (lost if that sidecar dies meanwhile).
    pub deferred_table: String,
    /// Results whose cache entry would be larger than this, in bytes, are answered but not
    /// cached (marked bypass).
    pub max_entry_bytes: usize,
    /// Most reads in one /v1/batch call, or ids in one /v1/batch/keyed call.
    pub max_batch: usize,
    /// An empty result (no rows: an id nobody wrote, say) is cached at most this long, in
    /// seconds, whatever TTL its read asked for, and with no stale grace.
    pub negative_ttl_s: u64,
    /// Every read that asks for no caching (a `/v1` read with no `cache` of a named query with
    /// no `ttl_s`, a `/sql` read with no `Ferry-Cache-TTL` of a token with no `cache_ttl_s`) is
    /// cached this many seconds on the tables Postgres says it reads, where the change stream is
    /// on (else refused at load); 0: off.
    pub default_ttl_s: u64,
    /// Functions the operator vouches for, as `schema.name(argument types)`
    /// (`public.shout(text)`, as `--explain-cache` names them): they read no table and give the
    /// same answer for the same arguments, so a read calling them may be cached on its tables.
    /// Postgres cannot check a user's function; a wrong entry is a stale read.
    pub immutable_functions: Vec<String>,
}

/// Bounds on the work one request may cause. The defaults fit a sidecar of 64 MB.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Most rows one read may return (beyond: 422 result_too_large).
    pub max_read_rows: usize,
    /// Most bytes of values one read may return, counted as rows arrive.
    pub max_read_bytes: usize,
    /// Most bytes of values one /v1/batch may return, all reads together.
    pub max_batch_bytes: usize,
    /// Most keys one write may invalidate by name (`invalidate.keys`).
    pub max_invalidate_keys: usize,
    /// Most statements in one /v1/transaction (they hold one pooled connection throughout).
    pub max_transaction_statements: usize,
    /// Most interactive transactions open at once (each holds a pooled connection until it
    /// ends); 0: half of the pooled share that writes use (`Config::pg_split`).
    pub max_open_transactions: usize,
    /// An interactive transaction idle this long, in milliseconds, is rolled back and its
    /// connection freed (at most half of server.request_timeout_ms, Postgres's own idle limit).
    pub transaction_idle_timeout_ms: u64,
    /// An interactive transaction is rolled back this long after it began, in milliseconds.
    pub transaction_max_lifetime_ms: u64,
    /// Most keys and tags kept for a later invalidation while Redis is unreachable. Past it
    /// the whole cache is invalidated at once when Redis is back (nothing is dropped).
    pub max_pending_invalidations: usize,
    /// Requests per second one anonymous caller (`caller`, the address the edge passes) may
    /// send on average; 0 turns the per-caller budget off. Past it: 429 + Retry-After.
    pub anonymous_rate_per_s: u32,
    /// How many requests one anonymous caller may send at once above that rate.
    pub anonymous_burst: u32,
    /// Requests per second all anonymous callers together may send; 0 turns it off.
    pub anonymous_total_per_s: u32,
    /// How many anonymous requests may come at once above that total rate.
    pub anonymous_total_burst: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_read_rows: 10_000,
            max_read_bytes: 4 * 1024 * 1024,
            max_batch_bytes: 16 * 1024 * 1024,
            max_invalidate_keys: 1_000,
            max_transaction_statements: 100,
            max_open_transactions: 0,
            transaction_idle_timeout_ms: 5_000,
            transaction_max_lifetime_ms: 30_000,
            max_pending_invalidations: 100_000,
            anonymous_rate_per_s: 20,
            anonymous_burst: 40,
            anonymous_total_per_s: 500,
            anonymous_total_burst: 1000,
        }
    }
}

impl ServerConfig {
    /// The worker threads actix runs (`workers`, or one per core when 0).
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8787".into(),
            workers: 0,
            body_limit_bytes: 1024 * 1024,
            request_timeout_ms: 10_000,
            max_in_flight: 256,
            retry_after_s: 1,
            shutdown_timeout_s: 30,
            log_format: "text".into(),
            log_level: "info".into(),
            readiness_interval_ms: 1_000,
            admin_listen: "127.0.0.1:9187".into(),
            tls_cert_path: String::new(),
            tls_key_path: String::new(),
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            secret: Redacted::default(),
            secret_file: String::new(),
            max_skew_s: ferry_shared::sign::DEFAULT_MAX_SKEW_S,
            allow_raw_sql: false,
            previous_secret: Redacted::default(),
            replay: ReplayScope::Shared,
            nonce_table: "ferry.nonces".into(),
        }
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            tls_ca_path: String::new(),
            password_file: String::new(),
            pool_size: 10,
            min_idle: 1,
            checkout_timeout_ms: 1_500,
            connect_timeout_ms: 2_000,
            statement_timeout_ms: 5_000,
            owner_url: RedactedUrl::default(),
            single_role: false,
            password: None,
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            key_prefix: "ferry:".into(),
            max_ttl_s: 30 * 24 * 3600,
            max_key_bytes: 512,
            invalidation_retry_ms: 500,
            deferred_table: "ferry.deferred".into(),
            max_entry_bytes: 1024 * 1024,
            max_batch: 1000,
            negative_ttl_s: 10,
            default_ttl_s: 0,
            immutable_functions: Vec::new(),
        }
    }
}

impl Config {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.server.request_timeout_ms)
    }

    /// How long an interactive transaction may idle: the setting, but at most half of
    /// Postgres's own limit (`idle_in_transaction_session_timeout`, set from
    /// `server.request_timeout_ms`), so the sidecar always ends it first.
    pub fn transaction_idle_timeout(&self) -> Duration {
        let postgres_ms = self.server.request_timeout_ms.max(1000);
        Duration::from_millis(self.limits.transaction_idle_timeout_ms.min(postgres_ms / 2))
    }

    /// How many interactive transactions may be open at once: each holds one connection of
    /// the pooled share that writes use, so never all of it. Unset: half of that share.
    pub fn max_open_transactions(&self) -> usize {
        match self.limits.max_open_transactions {
            0 => self.pg_pooled_share() / 2,
            n => n,
        }
    }

    /// How `postgres.pool_size` is split: each worker's event-loop sessions (three quarters of
    /// the pool, shared equally), and the pooled share that writes, batches, fills and
    /// transactions use (the rest). (per worker, pooled)
    pub fn pg_split(&self) -> (usize, usize) {
        let size = self.postgres.pool_size as usize;
        let workers = self.server.worker_count().max(1);
        let per_worker = (size * 3 / 4) / workers;
        (per_worker, size - per_worker * workers)
    }

    /// The pooled share of `postgres.pool_size` (see [`Config::pg_split`]).
    pub fn pg_pooled_share(&self) -> usize {
        self.pg_split().1
    }

    /// Whether Ferry keeps bookkeeping in Postgres: write outcomes and replay nonces
    /// (`auth.replay = "shared"`), deferred invalidations (`cache.deferred_table`).
    pub fn keeps_books(&self) -> bool {
        self.auth.replay == ReplayScope::Shared || !self.cache.deferred_table.is_empty()
    }

    /// The configuration Ferry's own role connects with: `postgres.owner_url` in place of
    /// `postgres.url` (its password in the URL), or `postgres.url` itself with `single_role`.
    pub fn owner_config(&self) -> Config {
        let mut c = self.clone();
        if !self.postgres.owner_url.is_empty() {
            c.postgres.url = self.postgres.owner_url.clone();
            c.postgres.password = None;
        }
        c
    }

    /// The request bounds in force (a snapshot of `cache` and `limits`).
    pub fn limits(&self) -> Limits {
        Limits::new(self)
    }
}

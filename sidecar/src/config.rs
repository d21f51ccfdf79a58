//! Configuration: one TOML file (every key optional, defaults below), then environment overrides.
//!
//! Every key `section.key` can be set with `FERRY_SECTION_KEY` (e.g. `redis.pool_size` with
//! `FERRY_REDIS_POOL_SIZE`). Four short aliases let the binary run with no file at all:
//! `FERRY_LISTEN`, `FERRY_REDIS_URL`, `FERRY_DATABASE_URL`, `FERRY_SECRET`.
//! `deploy/ferry.toml` is the commented sample; keep it in step with this file.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub redis: RedisConfig,
    pub postgres: PostgresConfig,
    pub cache: CacheConfig,
    pub limits: LimitsConfig,
    /// Named statements: `[queries.NAME]`. Callers send `"query": "NAME"` instead of SQL.
    pub queries: BTreeMap<String, NamedQuery>,
    /// Keyspaces for keyed batch reads: `[keyspaces.NAME]`.
    pub keyspaces: BTreeMap<String, Keyspace>,
}

/// A statement the config names, with an optional default cache policy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedQuery {
    pub sql: String,
    /// Reads of this query are cached this long, in seconds, unless the request says otherwise.
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// Stale-while-revalidate window after the TTL, in seconds.
    #[serde(default)]
    pub swr_s: Option<u64>,
    /// Stale-if-error grace after the TTL, in seconds.
    #[serde(default)]
    pub stale_if_error_s: Option<u64>,
    /// Tags its cached results carry.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// Rows addressed by one key column, read many at a time.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Keyspace {
    /// Takes the missing ids as an array in `$1`: `SELECT ... FROM items WHERE id = ANY($1)`.
    pub sql: String,
    /// The column whose value is the id (`id`).
    pub key_column: String,
    /// Seconds each row stays cached.
    pub ttl_s: u64,
    /// Tags every row of the keyspace carries (invalidate them all by tag).
    #[serde(default)]
    pub tags: Vec<String>,
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

#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The shared HMAC secret (prefer `secret_file` or the FERRY_SECRET variable).
    pub secret: String,
    /// A file holding the secret (trailing newline ignored); wins over `secret` when set.
    pub secret_file: String,
    /// Allowed clock difference between signer and sidecar, in seconds.
    pub max_skew_s: u64,
    /// Whether callers may send raw SQL; false: only `[queries.NAME]` statements (raw: 403).
    pub allow_raw_sql: bool,
    /// During a secret rotation: the old secret, still accepted alongside `secret`. Empty: none.
    pub previous_secret: String,
}

#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// redis:// URL, or rediss:// for TLS (password in the URL or in FERRY_REDIS_URL).
    pub url: String,
    /// PEM CA certificate(s) to trust for rediss:// (a private CA); empty: the system's roots.
    pub tls_ca_path: String,
    /// Most connections the pool ever opens.
    pub pool_size: u32,
    /// Idle connections kept open.
    pub min_idle: u32,
    /// Longest wait for a pooled connection, in milliseconds.
    pub checkout_timeout_ms: u64,
    /// TCP connect timeout for a new connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Read/write timeout of one Redis command, in milliseconds.
    pub io_timeout_ms: u64,
    /// After a Redis failure, reads skip Redis for this long, in milliseconds, instead of
    /// paying a timeout each.
    pub retry_after_failure_ms: u64,
}

#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// libpq-style URL: postgres://user:password@host:port/db[?sslmode=require].
    pub url: String,
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
    /// The password read from `password_file` (never serialized, never logged).
    #[serde(skip)]
    pub password: Option<String>,
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
    /// Results whose cache entry would be larger than this, in bytes, are answered but not
    /// cached (marked bypass).
    pub max_entry_bytes: usize,
    /// Most reads in one /v1/batch call, or ids in one /v1/batch/keyed call.
    pub max_batch: usize,
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
    /// Most keys and tags kept for a later invalidation while Redis is unreachable. Past it
    /// the whole cache is invalidated at once when Redis is back (nothing is dropped).
    pub max_pending_invalidations: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_read_rows: 10_000,
            max_read_bytes: 4 * 1024 * 1024,
            max_batch_bytes: 16 * 1024 * 1024,
            max_invalidate_keys: 1_000,
            max_pending_invalidations: 100_000,
        }
    }
}

impl LimitsConfig {
    pub fn read(&self) -> crate::db::ReadLimits {
        crate::db::ReadLimits {
            max_rows: self.max_read_rows,
            max_bytes: self.max_read_bytes,
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

/// Redacted: a config printed in a log or a panic must not carry the secret.
impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("secret", &"<redacted>")
            .field("secret_file", &self.secret_file)
            .field("max_skew_s", &self.max_skew_s)
            .field("allow_raw_sql", &self.allow_raw_sql)
            .field("previous_secret", &"<redacted>")
            .finish()
    }
}

/// `scheme://user:password@host` with the password hidden, for Debug output.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:<redacted>{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("tls_ca_path", &self.tls_ca_path)
            .field("pool_size", &self.pool_size)
            .field("min_idle", &self.min_idle)
            .field("checkout_timeout_ms", &self.checkout_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("io_timeout_ms", &self.io_timeout_ms)
            .field("retry_after_failure_ms", &self.retry_after_failure_ms)
            .finish()
    }
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &redact_url(&self.url))
            .field("tls_ca_path", &self.tls_ca_path)
            .field("password_file", &self.password_file)
            .field("pool_size", &self.pool_size)
            .field("min_idle", &self.min_idle)
            .field("checkout_timeout_ms", &self.checkout_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            secret: String::new(),
            secret_file: String::new(),
            max_skew_s: ferry_shared::sign::DEFAULT_MAX_SKEW_S,
            allow_raw_sql: false,
            previous_secret: String::new(),
        }
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379".into(),
            tls_ca_path: String::new(),
            pool_size: 8,
            min_idle: 1,
            checkout_timeout_ms: 1_000,
            connect_timeout_ms: 500,
            io_timeout_ms: 1_000,
            retry_after_failure_ms: 1_000,
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
            max_entry_bytes: 1024 * 1024,
            max_batch: 1000,
        }
    }
}

/// A configuration problem, naming the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("environment variable {var} (key {key}): {message}")]
    Env {
        var: String,
        key: String,
        message: String,
    },
    #[error("key {key}: {message}")]
    Invalid { key: String, message: String },
}

/// Short aliases, checked after the generic `FERRY_SECTION_KEY` names.
const ALIASES: &[(&str, &str, &str)] = &[
    ("FERRY_LISTEN", "server", "listen"),
    ("FERRY_REDIS_URL", "redis", "url"),
    ("FERRY_DATABASE_URL", "postgres", "url"),
    ("FERRY_SECRET", "auth", "secret"),
];

impl Config {
    /// Reads the file (if any), applies overrides from `env`, and validates.
    pub fn load(
        path: Option<&Path>,
        env: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let mut table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                toml::from_str::<toml::Table>(&text).map_err(|e| ConfigError::Parse {
                    path: p.display().to_string(),
                    message: e.to_string(),
                })?
            }
            None => toml::Table::new(),
        };
        apply_env(&mut table, env)?;
        let mut config: Config =
            Config::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Parse {
                path: path.map_or("(environment)".into(), |p| p.display().to_string()),
                message: e.to_string(),
            })?;
        config.resolve_files()?;
        config.validate()?;
        Ok(config)
    }

    /// Replaces `*_file` settings by the contents of the files they name.
    fn resolve_files(&mut self) -> Result<(), ConfigError> {
        let read = |key: &str, path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
                .map_err(|e| ConfigError::Invalid {
                    key: key.into(),
                    message: format!("cannot read {path}: {e}"),
                })
        };
        if !self.auth.secret_file.is_empty() {
            self.auth.secret = read("auth.secret_file", &self.auth.secret_file)?;
        }
        if !self.postgres.password_file.is_empty() {
            self.postgres.password = Some(read(
                "postgres.password_file",
                &self.postgres.password_file,
            )?);
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                key: key.into(),
                message: message.into(),
            })
        };
        if self.server.listen.parse::<std::net::SocketAddr>().is_err()
            && !self.server.listen.contains(':')
        {
            return invalid("server.listen", "expected host:port");
        }
        if self.server.tls_cert_path.is_empty() != self.server.tls_key_path.is_empty() {
            return invalid(
                "server.tls_cert_path",
                "set both tls_cert_path and tls_key_path, or neither",
            );
        }
        if !self.server.tls_cert_path.is_empty() {
            if let Err(e) =
                crate::tls::server_config(&self.server.tls_cert_path, &self.server.tls_key_path)
            {
                return invalid("server.tls_cert_path", &e);
            }
        }
        if self.server.body_limit_bytes == 0 {
            return invalid("server.body_limit_bytes", "must be at least 1");
        }
        if self.server.max_in_flight == 0 {
            return invalid("server.max_in_flight", "must be at least 1");
        }
        if !matches!(self.server.log_format.as_str(), "text" | "json") {
            return invalid("server.log_format", "must be \"text\" or \"json\"");
        }
        if self.auth.secret.len() < 16 {
            return invalid(
                "auth.secret",
                "must be set and at least 16 bytes (FERRY_SECRET, auth.secret or auth.secret_file)",
            );
        }
        if !self.auth.previous_secret.is_empty() && self.auth.previous_secret.len() < 16 {
            return invalid("auth.previous_secret", "must be empty or at least 16 bytes");
        }
        if self.redis.pool_size == 0 {
            return invalid("redis.pool_size", "must be at least 1");
        }
        if self.redis.min_idle > self.redis.pool_size {
            return invalid("redis.min_idle", "must not exceed redis.pool_size");
        }
        if let Err(e) = crate::pools::redis_client(&self.redis) {
            return invalid("redis.url", &e);
        }
        if self.postgres.pool_size == 0 {
            return invalid("postgres.pool_size", "must be at least 1");
        }
        if self.postgres.min_idle > self.postgres.pool_size {
            return invalid("postgres.min_idle", "must not exceed postgres.pool_size");
        }
        if crate::pools::pg_url(&self.postgres.url)
            .parse::<postgres::Config>()
            .is_err()
        {
            return invalid("postgres.url", "not a valid postgres URL");
        }
        if let Err(e) = crate::pools::pg_tls(&self.postgres) {
            return invalid("postgres.tls_ca_path", &e);
        }
        if self.cache.max_ttl_s == 0 {
            return invalid("cache.max_ttl_s", "must be at least 1");
        }
        if self.cache.max_batch == 0 {
            return invalid("cache.max_batch", "must be at least 1");
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.max_read_rows", l.max_read_rows),
            ("limits.max_read_bytes", l.max_read_bytes),
            ("limits.max_batch_bytes", l.max_batch_bytes),
            ("limits.max_invalidate_keys", l.max_invalidate_keys),
            (
                "limits.max_pending_invalidations",
                l.max_pending_invalidations,
            ),
        ] {
            if v == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        for (name, q) in &self.queries {
            if q.sql.trim().is_empty() {
                return invalid(&format!("queries.{name}.sql"), "must not be empty");
            }
            if let Some(r) = crate::statement::classify(&q.sql, crate::statement::Route::Write) {
                return invalid(
                    &format!("queries.{name}.sql"),
                    &format!("statement not allowed ({})", r.class()),
                );
            }
            if q.ttl_s == Some(0) {
                return invalid(&format!("queries.{name}.ttl_s"), "must be at least 1");
            }
        }
        for (name, k) in &self.keyspaces {
            if crate::statement::classify(&k.sql, crate::statement::Route::Read).is_some() {
                return invalid(&format!("keyspaces.{name}.sql"), "must be a read (SELECT)");
            }
            if !k.sql.contains("$1") {
                return invalid(
                    &format!("keyspaces.{name}.sql"),
                    "must take the ids as an array in $1 (WHERE id = ANY($1))",
                );
            }
            if k.key_column.trim().is_empty() {
                return invalid(&format!("keyspaces.{name}.key_column"), "must not be empty");
            }
            if k.ttl_s == 0 || k.ttl_s > self.cache.max_ttl_s {
                return invalid(
                    &format!("keyspaces.{name}.ttl_s"),
                    "must be between 1 and cache.max_ttl_s",
                );
            }
        }
        Ok(())
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.server.request_timeout_ms)
    }
}

/// Overrides keys of `table` from `FERRY_SECTION_KEY` variables. Known keys come from the
/// defaults, so a variable is parsed as the type its key has (number, bool or string).
fn apply_env(table: &mut toml::Table, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    let defaults = toml::Table::try_from(Config::default()).map_err(|e| ConfigError::Invalid {
        key: "(defaults)".into(),
        message: e.to_string(),
    })?;
    let mut overrides: Vec<(String, String, String, String)> = Vec::new();
    for (section, keys) in &defaults {
        let Some(keys) = keys.as_table() else {
            continue;
        };
        for key in keys.keys() {
            let var = format!("FERRY_{}_{}", section, key).to_ascii_uppercase();
            if let Some(v) = env.get(&var) {
                overrides.push((var, section.clone(), key.clone(), v.clone()));
            }
        }
    }
    for (var, section, key) in ALIASES {
        if let Some(v) = env.get(*var) {
            overrides.push((
                var.to_string(),
                section.to_string(),
                key.to_string(),
                v.clone(),
            ));
        }
    }
    for (var, section, key, raw) in overrides {
        let default = &defaults[&section][&key];
        let value = match default {
            toml::Value::Integer(_) => raw
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    key: format!("{section}.{key}"),
                    message: format!("expected a whole number, got {raw:?}"),
                })?,
            toml::Value::Boolean(_) => raw
                .trim()
                .parse::<bool>()
                .map(toml::Value::Boolean)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    key: format!("{section}.{key}"),
                    message: format!("expected true or false, got {raw:?}"),
                })?,
            _ => toml::Value::String(raw),
        };
        let section_table = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match section_table.as_table_mut() {
            Some(t) => {
                t.insert(key, value);
            }
            None => {
                return Err(ConfigError::Invalid {
                    key: section,
                    message: "must be a table".into(),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const SECRET: (&str, &str) = ("FERRY_SECRET", "0123456789abcdef0123");

    #[test]
    fn runs_from_environment_alone() {
        let c = Config::load(
            None,
            &env(&[
                SECRET,
                ("FERRY_LISTEN", "0.0.0.0:9000"),
                ("FERRY_REDIS_URL", "redis://127.0.0.1:7000"),
                ("FERRY_DATABASE_URL", "postgres://u@127.0.0.1:7001/db"),
                ("FERRY_POSTGRES_POOL_SIZE", "3"),
            ]),
        )
        .expect("valid");
        assert_eq!(c.server.listen, "0.0.0.0:9000");
        assert_eq!(c.redis.url, "redis://127.0.0.1:7000");
        assert_eq!(c.postgres.pool_size, 3);
    }

    #[test]
    fn bad_values_name_their_key() {
        let e = Config::load(None, &env(&[SECRET, ("FERRY_REDIS_POOL_SIZE", "many")]))
            .expect_err("invalid");
        assert!(e.to_string().contains("redis.pool_size"), "{e}");
        let e = Config::load(None, &env(&[SECRET, ("FERRY_REDIS_POOL_SIZE", "0")]))
            .expect_err("invalid");
        assert!(e.to_string().contains("redis.pool_size"), "{e}");
        let e = Config::load(None, &env(&[])).expect_err("no secret");
        assert!(e.to_string().contains("auth.secret"), "{e}");
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "[redis]\npool_sise = 3\n").expect("write");
        let e = Config::load(Some(&path), &env(&[SECRET])).expect_err("unknown key");
        assert!(e.to_string().contains("pool_sise"), "{e}");
    }

    #[test]
    fn secrets_can_come_from_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        let password = dir.path().join("pgpass");
        std::fs::write(&secret, "file-secret-0123456789\n").expect("write");
        std::fs::write(&password, "hunter2\n").expect("write");
        let c = Config::load(
            None,
            &env(&[
                (
                    "FERRY_AUTH_SECRET_FILE",
                    secret.to_str().expect("utf-8 path"),
                ),
                (
                    "FERRY_POSTGRES_PASSWORD_FILE",
                    password.to_str().expect("utf-8 path"),
                ),
            ]),
        )
        .expect("valid");
        assert_eq!(c.auth.secret, "file-secret-0123456789");
        assert_eq!(c.postgres.password.as_deref(), Some("hunter2"));
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("file-secret") && !debug.contains("hunter2"),
            "{debug}"
        );
        let e = Config::load(None, &env(&[("FERRY_AUTH_SECRET_FILE", "/nonexistent/x")]))
            .expect_err("missing file");
        assert!(e.to_string().contains("auth.secret_file"), "{e}");
    }

    #[test]
    fn url_passwords_are_redacted_in_debug() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/app"),
            "postgres://app:<redacted>@db:5432/app"
        );
        assert_eq!(
            redact_url("redis://:pw@r:6379"),
            "redis://:<redacted>@r:6379"
        );
        assert_eq!(redact_url("redis://r:6379"), "redis://r:6379");
    }

    #[test]
    fn tls_needs_both_files_that_load() {
        let e = Config::load(
            None,
            &env(&[
                SECRET,
                ("FERRY_SERVER_TLS_CERT_PATH", "/nonexistent/cert.pem"),
            ]),
        )
        .expect_err("half a TLS config");
        assert!(e.to_string().contains("server.tls_cert_path"), "{e}");
        let e = Config::load(
            None,
            &env(&[
                SECRET,
                ("FERRY_SERVER_TLS_CERT_PATH", "/nonexistent/cert.pem"),
                ("FERRY_SERVER_TLS_KEY_PATH", "/nonexistent/key.pem"),
            ]),
        )
        .expect_err("missing files");
        assert!(e.to_string().contains("/nonexistent/cert.pem"), "{e}");
    }

    #[test]
    fn sample_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ferry.toml");
        let c = Config::load(Some(&path), &env(&[SECRET])).expect("sample config is valid");
        assert_eq!(c.redis.pool_size, RedisConfig::default().pool_size);
    }
}

//! The rules each key must keep, checked at load (naming the key). Checks that need a store
//! client (URLs, TLS files, statements) are made by `startup::check_config`, so this module imports
//! nothing of the stores.

use super::{Config, ConfigError};

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        let pooled = self.pg_pooled_share();
        if self.limits.max_open_transactions > 0 && self.limits.max_open_transactions >= pooled {
            return Err(ConfigError::Invalid {
                key: "limits.max_open_transactions".into(),
                message: format!(
                    "at most {} here: each open transaction holds a connection of the {pooled} \
                     that writes share (postgres.pool_size minus the workers' sessions), and at \
                     least one must stay free for writes",
                    pooled.saturating_sub(1)
                ),
            });
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
        if !self.cache.deferred_table.is_empty()
            && super::changes::table_name(&self.cache.deferred_table).is_none()
        {
            return invalid(
                "cache.deferred_table",
                "must be empty or a table name, optionally schema-qualified (unquoted identifiers)",
            );
        }
        if super::changes::table_name(&self.auth.nonce_table).is_none() {
            return invalid(
                "auth.nonce_table",
                "must be a table name, optionally schema-qualified (unquoted identifiers)",
            );
        }
        if self.redis.pool_size == 0 {
            return invalid("redis.pool_size", "must be at least 1");
        }
        if self.redis.min_idle > self.redis.pool_size {
            return invalid("redis.min_idle", "must not exceed redis.pool_size");
        }
        if self.redis.cluster {
            if self.redis.urls().is_empty() {
                return invalid("redis.url", "give at least one cluster node");
            }
            // A brace in the prefix would become the hash tag of every key: one slot for all.
            if self.cache.key_prefix.contains(['{', '}']) {
                return invalid(
                    "cache.key_prefix",
                    "may not contain { or } with redis.cluster",
                );
            }
        }
        if self.postgres.single_role && !self.postgres.owner_url.is_empty() {
            return invalid(
                "postgres.single_role",
                "one role for everything, or Ferry's own role in postgres.owner_url: not both",
            );
        }
        if self.keeps_books() && self.postgres.owner_url.is_empty() && !self.postgres.single_role {
            return invalid(
                "postgres.owner_url",
                "Ferry's bookkeeping (auth.replay = \"shared\", cache.deferred_table) needs a role \
                 of its own that no request runs as (scripts/demo.sql makes ferry_owner); or set \
                 postgres.single_role = true (unsafe: a caller's SQL can then forge outcomes)",
            );
        }
        if self.postgres.pool_size == 0 {
            return invalid("postgres.pool_size", "must be at least 1");
        }
        if self.postgres.min_idle > self.postgres.pool_size {
            return invalid("postgres.min_idle", "must not exceed postgres.pool_size");
        }
        if self.cache.max_ttl_s == 0 {
            return invalid("cache.max_ttl_s", "must be at least 1");
        }
        for (i, f) in self.cache.immutable_functions.iter().enumerate() {
            let shaped = f.split_once('.').is_some_and(|(schema, rest)| {
                !schema.is_empty() && rest.contains('(') && rest.ends_with(')')
            });
            if !shaped {
                return invalid(
                    &format!("cache.immutable_functions[{i}]"),
                    "schema.name(argument types), as --explain-cache names it: public.shout(text)",
                );
            }
        }
        if self.cache.default_ttl_s > self.cache.max_ttl_s {
            return invalid("cache.default_ttl_s", "must not exceed cache.max_ttl_s");
        }
        if self.cache.default_ttl_s > 0 && !self.changes.enabled {
            return invalid(
                "cache.default_ttl_s",
                "needs [changes] on: only the change stream keeps reads fresh that name no tables",
            );
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
            if q.ttl_s == Some(0) {
                return invalid(&format!("queries.{name}.ttl_s"), "must be at least 1");
            }
            match (&q.batch_sql, &q.batch_key) {
                (None, None) => {}
                (Some(b), Some(k)) if b.contains("$1") && !b.contains("$2") && !k.is_empty() => {
                    if !q.sql.contains("$1") || q.sql.contains("$2") {
                        return invalid(
                            &format!("queries.{name}.batch_sql"),
                            "a batch form is for a query of one parameter ($1)",
                        );
                    }
                }
                _ => {
                    return invalid(
                        &format!("queries.{name}.batch_sql"),
                        "give batch_sql (taking every value as an array in $1, and nothing else) \
                         and batch_key (the column carrying it) together",
                    )
                }
            }
        }
        for (name, k) in &self.keyspaces {
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
        if self.limits.transaction_idle_timeout_ms == 0 {
            return invalid("limits.transaction_idle_timeout_ms", "must be at least 1");
        }
        if self.limits.transaction_max_lifetime_ms < self.limits.transaction_idle_timeout_ms {
            return invalid(
                "limits.transaction_max_lifetime_ms",
                "must be at least limits.transaction_idle_timeout_ms",
            );
        }
        self.validate_changes()?;
        self.validate_upstash()?;
        self.validate_identity()?;
        self.validate_replicas()?;
        self.validate_neon()
    }
}

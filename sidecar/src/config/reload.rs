//! SIGHUP: every key either takes effect or is reported as needing a restart; none is silently
//! left as it was.
//!
//! The new config is taken apart whole (no `..`): a key added to any section is a compile
//! error here until someone decides whether it can change live. What changes live is what
//! handlers read from the config snapshot of each request (tokens, secrets, limits, named
//! queries, identity); what was built into the pools, the listeners, the caches or the
//! background tasks at startup keeps its old value and is named in the answer.
//!
//! Credentials always change live: a token removed from the file, or a secret replaced, is
//! refused from the moment the reload is applied. A Neon token whose role has no sessions yet
//! (a `postgres_url` the sidecar did not start with) is kept out until the restart.

use super::{
    AuthConfig, CacheConfig, Config, LimitsConfig, NeonConfig, ServerConfig, UpstashConfig,
};

/// What a reload applies, and the keys that changed but wait for a restart.
#[derive(Debug)]
pub struct Reloaded {
    pub config: Config,
    pub restart: Vec<String>,
}

/// `old` with what `new` may change live; `has_role(url)`: whether the sidecar has sessions
/// for a Neon token's `postgres_url`.
pub fn reload(old: &Config, new: Config, has_role: impl Fn(&str) -> bool) -> Reloaded {
    let mut restart = Vec::new();
    let Config {
        server,
        auth,
        redis,
        postgres,
        replicas,
        cache,
        limits,
        changes,
        upstash,
        neon,
        identity,
        queries,
        keyspaces,
    } = new;
    let mut keep = |key: &str, changed: bool| {
        if changed {
            restart.push(key.to_string());
        }
    };
    // Built into the pools, the replicas' monitor and the change stream at startup.
    keep("redis", redis != old.redis);
    keep("postgres", postgres != old.postgres);
    keep("replicas", replicas != old.replicas);
    keep("changes", changes != old.changes);

    let ServerConfig {
        listen,
        workers,
        body_limit_bytes,
        request_timeout_ms,
        max_in_flight,
        retry_after_s,
        shutdown_timeout_s,
        log_format,
        log_level,
        readiness_interval_ms,
        admin_listen,
        tls_cert_path,
        tls_key_path,
    } = server;
    let o = &old.server;
    for (key, changed) in [
        ("server.listen", listen != o.listen),
        ("server.workers", workers != o.workers),
        (
            "server.body_limit_bytes",
            body_limit_bytes != o.body_limit_bytes,
        ),
        (
            "server.request_timeout_ms",
            request_timeout_ms != o.request_timeout_ms,
        ),
        ("server.max_in_flight", max_in_flight != o.max_in_flight),
        (
            "server.shutdown_timeout_s",
            shutdown_timeout_s != o.shutdown_timeout_s,
        ),
        ("server.log_format", log_format != o.log_format),
        (
            "server.readiness_interval_ms",
            readiness_interval_ms != o.readiness_interval_ms,
        ),
        ("server.admin_listen", admin_listen != o.admin_listen),
        ("server.tls_cert_path", tls_cert_path != o.tls_cert_path),
        ("server.tls_key_path", tls_key_path != o.tls_key_path),
    ] {
        keep(key, changed);
    }
    let server = ServerConfig {
        log_level,
        retry_after_s,
        ..old.server.clone()
    };

    let AuthConfig {
        secret,
        secret_file,
        max_skew_s,
        allow_raw_sql,
        previous_secret,
        replay,
        nonce_table,
    } = auth;
    let o = &old.auth;
    keep("auth.max_skew_s", max_skew_s != o.max_skew_s);
    keep("auth.replay", replay != o.replay);
    keep("auth.nonce_table", nonce_table != o.nonce_table);
    // The secrets were read from it: the file's name itself changes nothing more.
    let auth = AuthConfig {
        secret,
        secret_file,
        allow_raw_sql,
        previous_secret,
        ..old.auth.clone()
    };

    let CacheConfig {
        key_prefix,
        max_ttl_s,
        max_key_bytes,
        invalidation_retry_ms,
        deferred_table,
        max_entry_bytes,
        max_batch,
        negative_ttl_s,
        default_ttl_s,
        immutable_functions,
    } = cache;
    let o = &old.cache;
    keep("cache.key_prefix", key_prefix != o.key_prefix);
    keep(
        "cache.invalidation_retry_ms",
        invalidation_retry_ms != o.invalidation_retry_ms,
    );
    keep("cache.deferred_table", deferred_table != o.deferred_table);
    keep(
        "cache.max_entry_bytes",
        max_entry_bytes != o.max_entry_bytes,
    );
    keep("cache.negative_ttl_s", negative_ttl_s != o.negative_ttl_s);
    let cache = CacheConfig {
        max_ttl_s,
        max_key_bytes,
        max_batch,
        default_ttl_s,
        immutable_functions,
        ..old.cache.clone()
    };

    let LimitsConfig {
        max_read_rows,
        max_read_bytes,
        max_batch_bytes,
        max_invalidate_keys,
        max_transaction_statements,
        max_open_transactions,
        transaction_idle_timeout_ms,
        transaction_max_lifetime_ms,
        max_pending_invalidations,
        anonymous_rate_per_s,
        anonymous_burst,
        anonymous_total_per_s,
        anonymous_total_burst,
    } = limits;
    let o = &old.limits;
    // The open transactions' bounds and the pending invalidations' were built in at startup.
    keep(
        "limits.max_open_transactions",
        max_open_transactions != o.max_open_transactions,
    );
    keep(
        "limits.transaction_idle_timeout_ms",
        transaction_idle_timeout_ms != o.transaction_idle_timeout_ms,
    );
    keep(
        "limits.transaction_max_lifetime_ms",
        transaction_max_lifetime_ms != o.transaction_max_lifetime_ms,
    );
    keep(
        "limits.max_pending_invalidations",
        max_pending_invalidations != o.max_pending_invalidations,
    );
    let limits = LimitsConfig {
        max_read_rows,
        max_read_bytes,
        max_batch_bytes,
        max_invalidate_keys,
        max_transaction_statements,
        anonymous_rate_per_s,
        anonymous_burst,
        anonymous_total_per_s,
        anonymous_total_burst,
        ..old.limits.clone()
    };

    // Tokens are read per request: all of them change live.
    let UpstashConfig {
        enabled,
        redis_url,
        pool_size,
        share_cache_redis,
        tokens,
    } = upstash;
    // The door's connections were opened for its Redis at startup.
    keep("upstash.redis_url", redis_url != old.upstash.redis_url);
    keep("upstash.pool_size", pool_size != old.upstash.pool_size);
    keep(
        "upstash.share_cache_redis",
        share_cache_redis != old.upstash.share_cache_redis,
    );
    let upstash = UpstashConfig {
        enabled,
        tokens,
        ..old.upstash.clone()
    };
    let NeonConfig { enabled, tokens } = neon;
    let mut kept_out = Vec::new();
    let tokens = tokens
        .into_iter()
        .enumerate()
        .filter(|(i, t)| {
            let ok = t.postgres_url.is_empty() || has_role(t.postgres_url.as_str());
            if !ok {
                kept_out.push(format!("neon.tokens[{i}] (a role without sessions yet)"));
            }
            ok
        })
        .map(|(_, t)| t)
        .collect();
    restart.extend(kept_out);
    let neon = NeonConfig { enabled, tokens };

    // The change stream watches a fixed set of tables: queries and keyspaces that would change
    // it wait for the restart (the rest of the reload applies).
    let mut applied = Config {
        server,
        auth,
        redis: old.redis.clone(),
        postgres: old.postgres.clone(),
        replicas: old.replicas.clone(),
        cache,
        limits,
        changes: old.changes.clone(),
        upstash,
        neon,
        identity,
        queries,
        keyspaces,
    };
    if old.changes.enabled && applied.watched_tables() != old.watched_tables() {
        applied.queries = old.queries.clone();
        applied.keyspaces = old.keyspaces.clone();
        restart.push("queries/keyspaces (they change the tables the change stream watches)".into());
    }
    Reloaded {
        config: applied,
        restart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{NeonToken, UpstashToken};

    #[test]
    fn credentials_change_live_and_the_rest_is_named() {
        let mut old = Config::default();
        old.auth.secret = "old-secret-0123456789".to_string().into();
        old.upstash.tokens = vec![UpstashToken {
            token: "u".repeat(32).into(),
            prefix: "a:".into(),
            ..Default::default()
        }];
        let mut new = old.clone();
        new.auth.secret = "new-secret-0123456789".to_string().into();
        new.upstash.tokens.clear();
        new.redis.pool_size += 1;
        new.server.listen = "127.0.0.1:1".into();
        new.neon.tokens = vec![NeonToken {
            token: "n".repeat(32).into(),
            postgres_url: "postgres://new_role@h/db".into(),
            ..Default::default()
        }];
        let r = reload(&old, new, |_| false);
        assert_eq!(r.config.auth.secret.as_str(), "new-secret-0123456789");
        assert!(r.config.upstash.tokens.is_empty());
        assert!(r.config.neon.tokens.is_empty(), "a role without sessions");
        assert_eq!(r.config.redis, old.redis);
        assert_eq!(r.config.server.listen, old.server.listen);
        for key in [
            "redis",
            "server.listen",
            "neon.tokens[0] (a role without sessions yet)",
        ] {
            assert!(
                r.restart.iter().any(|k| k == key),
                "{key} in {:?}",
                r.restart
            );
        }
    }
}

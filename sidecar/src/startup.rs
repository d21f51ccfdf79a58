//! What the binary checks and reports before it serves (`main.rs`, `--check-config`): the
//! library's whole surface for it, with the config, `run` and `admin`.

use crate::config::{Config, ConfigError};
use crate::store::postgres::own_sessions::{OwnSessions, Problem};
use crate::store::postgres::roles::Audit;

pub use crate::changes::{check as check_change_stream, SetupError};
pub use crate::store::postgres::role_warnings;
pub use crate::tls::install_crypto_provider;

/// The sessions Ferry would serve with, asked once: are they its own (no pooler between), and
/// are the roles kept apart? `Err`: refused for good (the sidecar must not start).
/// `Ok(Some(why))`: Postgres could not be asked. `Ok(None)`: checked and fine.
pub fn check_sessions(config: &Config) -> Result<Option<String>, String> {
    let own = match OwnSessions::for_config(config) {
        Ok(own) => own,
        Err(e) => return Ok(Some(e.to_string())),
    };
    match own.with_audit(Audit::for_config(config)).check() {
        Ok(()) => Ok(None),
        Err(Problem::Unreachable(e)) => Ok(Some(e)),
        Err(e) => Err(e.to_string()),
    }
}

/// What Postgres says of each named read: plain (no reset after a successful run) or why its
/// session is reset after it; and for one cached with no tables named, the tables it depends
/// on or why it is answered uncached. As `(warning, line)`. `Err`: Postgres could not be asked.
pub fn named_reads(config: &Config) -> Result<Vec<(bool, String)>, String> {
    let mut client = crate::store::postgres::check_session(config)?;
    let mut out = crate::store::statements::plain::report(config, &mut client)?;
    out.extend(crate::read::inferred_report::report(config, &mut client)?);
    Ok(out)
}

/// What Ferry would do with the read `sql` (`--explain-cache`): what Postgres's own parse of
/// it says it reads and calls, whether a named query of it skips the session reset, and
/// whether it can be cached and stay fresh, on which tables. Asked on a session of
/// `postgres.url`'s role, in a transaction rolled back. `Err`: not a read, or Postgres could
/// not be asked.
pub fn explain_cache(config: &Config, sql: &str) -> Result<String, String> {
    use crate::store::statements::class::{check, Route};
    check(sql, Route::Read).map_err(|e| e.to_string())?;
    let mut client = crate::store::postgres::check_session(config)?;
    let publication = config.changes.publication.as_str();
    let verdict = crate::store::postgres::analysis::analyse(&mut client, sql, Some(publication))
        .map_err(|e| crate::store::postgres::failure::describe(&e))?;
    if let crate::store::postgres::analysis::Verdict::Unknown(why) = &verdict {
        return Err(format!("not analysed: {why}"));
    }
    Ok(crate::read::inferred_report::explain(&verdict, config))
}

/// The configuration checks that need the stores' own client builders (URLs, TLS files, the
/// statements named in config), naming the key at fault. `Config::load` checks the rest; the
/// binary runs both at startup, on `--check-config` and on SIGHUP.
pub fn check_config(config: &Config) -> Result<(), ConfigError> {
    use crate::store::statements::class;
    use crate::store::{postgres as pg, redis as rd};
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        key: key.into(),
        message,
    };
    rd::store_client(&config.redis).map_err(|e| invalid("redis.url", e))?;
    rd::node_clients(&config.redis).map_err(|e| invalid("redis.url", e))?;
    if config.upstash.own_redis() {
        let place = |url: &str| {
            redis::IntoConnectionInfo::into_connection_info(url)
                .ok()
                .map(|i| (format!("{:?}", i.addr()), i.redis_settings().db()))
        };
        let Some(door) = place(config.upstash.redis_url.as_str()) else {
            return Err(invalid(
                "upstash.redis_url",
                "not a valid redis:// or rediss:// URL".into(),
            ));
        };
        let cache = config.redis.urls();
        if cache
            .iter()
            .any(|u| place(u).is_some_and(|c| c.0 == door.0))
        {
            return Err(invalid(
                "upstash.redis_url",
                "must be a Redis of the door's own, not the cache's (redis.url): scripts run \
                 there, and can stop the server they run on"
                    .into(),
            ));
        }
    }
    pg::pg_url(&config.postgres.url)
        .parse::<postgres::Config>()
        .map_err(|_| invalid("postgres.url", "not a valid postgres URL".into()))?;
    pg::pg_tls(&config.postgres).map_err(|e| invalid("postgres.tls_ca_path", e))?;
    for (i, url) in config.replicas.urls.iter().enumerate() {
        pg::pg_url(url).parse::<postgres::Config>().map_err(|_| {
            invalid(
                &format!("replicas.urls[{i}]"),
                "not a valid postgres URL".into(),
            )
        })?;
    }
    if !config.changes.url.is_empty() {
        pg::pg_url(&config.changes.url)
            .parse::<postgres::Config>()
            .map_err(|_| invalid("changes.url", "not a valid postgres URL".into()))?;
    }
    for (name, q) in &config.queries {
        if let Some(r) = class::classify(&q.sql, class::Route::Write) {
            let key = format!("queries.{name}.sql");
            return Err(invalid(
                &key,
                format!("statement not allowed ({})", r.class()),
            ));
        }
    }
    for (name, q) in &config.queries {
        if let Some(b) = &q.batch_sql {
            if class::classify(b, class::Route::Read).is_some() {
                let key = format!("queries.{name}.batch_sql");
                return Err(invalid(&key, "must be a read (SELECT)".into()));
            }
        }
    }
    for (name, k) in &config.keyspaces {
        if class::classify(&k.sql, class::Route::Read).is_some() {
            let key = format!("keyspaces.{name}.sql");
            return Err(invalid(&key, "must be a read (SELECT)".into()));
        }
    }
    Ok(())
}

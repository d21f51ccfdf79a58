//! From a request to what will run: the statement (raw or named), its parameters and the
//! resolved cache policy. All validation of reads happens here, before any I/O.

use crate::config::{table_name, Config, NamedQuery, ReadLimits, MAX_TAGS};
use crate::error::ApiError;
use crate::store::cache::{table_tag, Cache, EntryPolicy, HASH_KEY_PREFIX};
use crate::store::pools::session::Reset;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::postgres::top_n::TopN;
use ferry_shared::api::{CacheMode, Position, QueryRequest};
use serde_json::Value;
use std::fmt::Display;
use std::sync::Arc;

/// A read ready to run.
#[derive(Debug, Clone)]
pub(crate) struct ReadPlan {
    pub sql: String,
    pub params: Vec<Value>,
    /// The read bounds in force when it was planned.
    pub limits: ReadLimits,
    pub cache: Option<CachePlan>,
    pub format: ReadFormat,
    /// The end user it runs as; None: the sidecar's own role.
    pub identity: Option<Arc<SessionIdentity>>,
    /// The position the read must see (`after`): it decides whether a replica may serve it.
    pub after: Option<Position>,
    /// Whether its session is reset after it (`skip_reset` on its named query).
    pub reset: Reset,
    /// Its named query's batch form, when misses of it in one batch may share a statement.
    pub batch: Option<Arc<super::grouped::BatchForm>>,
    /// Whether its tables are to be inferred (`read::inferred::resolve`), or why it was not
    /// cached once they were.
    pub infer: Infer,
}

/// A read cached with no tables named, before and after Postgres was asked what it reads.
/// Until `read::inferred::resolve` has run, the read has no cache plan: one that skipped it
/// would be answered from Postgres, never from an entry kept fresh by nothing.
#[derive(Debug, Clone, Default)]
pub(crate) enum Infer {
    /// Tables named, a key named, or no cache asked for.
    #[default]
    No,
    /// The cache plan, its tables still to be inferred.
    Pending(Box<CachePlan>),
    /// Not cached: why.
    Refused(Arc<str>),
}

/// How a read's rows come back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum ReadFormat {
    /// Rows as JSON objects with typed values (`/v1`).
    #[default]
    Json,
    /// Postgres's text output, the whole result shaped as node-postgres shapes it (`/sql`):
    /// its cached value is that one result object, held as a single row. `role`: the Neon
    /// token's `postgres_url`, whose sessions run it (None: `postgres.url`'s).
    Text {
        array_mode: bool,
        role: Option<Arc<str>>,
    },
}

/// The cache policy of one read, resolved from the request and the named query's defaults.
#[derive(Debug, Clone)]
pub(crate) struct CachePlan {
    pub key: String,
    /// Hash of the statement and parameters: with `key` and `tags`, the entry's identity.
    pub fingerprint: String,
    pub entry: EntryPolicy,
    pub tags: Vec<String>,
    pub mode: CacheMode,
    /// A top-N read: its entry also depends on the rows it returned (`read::engine::fill`).
    pub rows_by: Option<TopN>,
}

/// The statement to run: raw SQL (if allowed) or a named one. `field` prefixes error fields.
pub(crate) fn statement<'c>(
    config: &'c Config,
    sql: Option<String>,
    query: Option<String>,
    field: &str,
) -> Result<(String, Option<&'c NamedQuery>), ApiError> {
    match (sql, query) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            format!("{field}sql"),
            "give either sql or query, not both",
        )),
        (None, None) => Err(ApiError::invalid(
            format!("{field}sql"),
            "give sql, or query naming a configured statement",
        )),
        (Some(sql), None) => {
            if !config.auth.allow_raw_sql {
                return Err(ApiError::RawSqlForbidden);
            }
            if sql.trim().is_empty() {
                return Err(ApiError::invalid(
                    format!("{field}sql"),
                    "must not be empty",
                ));
            }
            Ok((sql, None))
        }
        (None, Some(name)) => match config.queries.get(&name) {
            Some(q) => Ok((q.sql.clone(), Some(q))),
            None => Err(ApiError::invalid(
                format!("{field}query"),
                format!("no configured query named {name:?}"),
            )),
        },
    }
}

/// Resolves and validates one read. `field` prefixes error fields (`"reads[3]."` in batches).
pub(crate) fn read(config: &Config, req: QueryRequest, field: &str) -> Result<ReadPlan, ApiError> {
    let (sql, named) = statement(config, req.sql, req.query, field)?;
    let who = super::identity::identity(config, req.identity, named.is_none(), field)?;
    let defaults = named.cloned().unwrap_or_default();
    let reset = Reset::for_read(named, who.is_some());
    let batch = named.and_then(|q| super::grouped::BatchForm::of(q, &req.params, who.is_some()));
    // No caching asked for: the sidecar's default, if any (cache.default_ttl_s, inferred).
    let asked = req.cache.or_else(|| {
        let default = config.cache.default_ttl_s;
        (default > 0 && defaults.ttl_s.is_none() && config.changes.enabled).then(|| {
            ferry_shared::api::CachePolicy {
                ttl_s: Some(default),
                ..Default::default()
            }
        })
    });
    if asked.is_none() && defaults.ttl_s.is_none() {
        return Ok(ReadPlan {
            sql,
            params: req.params,
            limits: config.limits().read,
            cache: None,
            format: ReadFormat::Json,
            identity: who,
            after: req.after,
            reset,
            batch,
            infer: Infer::No,
        });
    }
    let asked = asked.unwrap_or_default();
    let limits = config.limits();
    let f = |name: &'static str| CacheField(field, name);
    let ttl_s = asked.ttl_s.or(defaults.ttl_s).ok_or_else(|| {
        ApiError::invalid(
            f("ttl_s").to_string(),
            "required (this query has no configured TTL)",
        )
    })?;
    limits.ttl(f("ttl_s"), ttl_s)?;
    let swr_s = asked.swr_s.or(defaults.swr_s).unwrap_or(0);
    limits.seconds(f("swr_s"), swr_s)?;
    let stale_if_error_s = asked
        .stale_if_error_s
        .or(defaults.stale_if_error_s)
        .unwrap_or(0);
    limits.seconds(f("stale_if_error_s"), stale_if_error_s)?;
    // The caller's tags first, in the caller's order, so that an error names the index it
    // sent; then the merged list, sorted, for the count.
    limits.tags(f("tags"), &asked.tags)?;
    let mut tags = defaults.tags;
    tags.extend(asked.tags);
    tags.sort();
    tags.dedup();
    limits.tags(f("tags"), &tags)?;
    // The tables' tags are Ferry's own, added after the callers' tags were checked.
    let tables = tables(config, &defaults.tables, &asked.tables, f("tables"))?;
    tags.extend(tables.iter().map(|t| table_tag(t)));
    if let Some(k) = &asked.key {
        if who.is_some() {
            // A named entry is one entry: it cannot hold each user's rows apart.
            return Err(ApiError::invalid(
                f("key").to_string(),
                "a read with an identity cannot name its entry; invalidate it by tags or tables",
            ));
        }
        limits.key(f("key"), k)?;
        if k.starts_with(HASH_KEY_PREFIX) {
            return Err(ApiError::invalid(
                f("key").to_string(),
                format!("keys starting with {HASH_KEY_PREFIX:?} are reserved for hashed entries"),
            ));
        }
    }
    let fingerprint = match &who {
        Some(who) => Cache::fingerprint_in(&who.scope(), &sql, &req.params),
        None => Cache::fingerprint(&sql, &req.params),
    };
    let key = Cache::logical_key(&fingerprint, asked.key.as_deref());
    let cache = CachePlan {
        key,
        fingerprint,
        entry: EntryPolicy {
            ttl_s,
            swr_s,
            stale_if_error_s,
        },
        tags,
        mode: asked.mode,
        rows_by: None,
    };
    // No tables and no key named, and the change stream on: Postgres says what it reads.
    let infer = config.changes.enabled
        && tables.is_empty()
        && asked.key.is_none()
        && asked.infer != Some(false);
    let (cache, infer) = match infer {
        true => (None, Infer::Pending(Box::new(cache))),
        false => (Some(cache), Infer::No),
    };
    Ok(ReadPlan {
        sql,
        params: req.params,
        limits: limits.read,
        cache,
        format: ReadFormat::Json,
        identity: who,
        after: req.after,
        reset,
        batch,
        infer,
    })
}

/// The tables a read depends on, normalized: the named query's (checked at load) and the
/// request's. With the change stream on, a request may only name tables it watches: an entry
/// depending on an unwatched table would never be invalidated by its writes.
pub(super) fn tables(
    config: &Config,
    named: &[String],
    asked: &[String],
    field: impl Display,
) -> Result<Vec<String>, ApiError> {
    if asked.len() > MAX_TAGS {
        return Err(ApiError::invalid(
            field.to_string(),
            format!("at most {MAX_TAGS} tables"),
        ));
    }
    let watched = (config.changes.enabled && !asked.is_empty()).then(|| config.watched_tables());
    let mut out: Vec<String> = named.iter().filter_map(|t| table_name(t)).collect();
    for (i, raw) in asked.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let t = table_name(raw).ok_or_else(|| {
            ApiError::invalid(&field, "not a table name (schema.table or table, unquoted)")
        })?;
        if watched.as_ref().is_some_and(|w| !w.contains(&t)) {
            return Err(ApiError::invalid(
                &field,
                format!("{t} is not watched by the change stream (add it to changes.tables)"),
            ));
        }
        out.push(t);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// A read's `cache.*` field under its prefix (`reads[3].cache.ttl_s` in a batch), spelled out
/// only when an error names it: a read that passes its checks formats no field names.
#[derive(Clone, Copy)]
struct CacheField<'a>(&'a str, &'static str);

impl Display for CacheField<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}cache.{}", self.0, self.1)
    }
}

impl CachePlan {
    /// What a single flight for this read is keyed by: reads that differ in key, statement,
    /// parameters or tags never share one.
    pub(crate) fn flight_identity(&self) -> String {
        format!(
            "{}\u{0}{}\u{0}{}",
            self.key,
            self.fingerprint,
            self.tags.join("\u{0}")
        )
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

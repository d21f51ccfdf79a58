//! The plan of a `/sql` read (the Neon door) that asks to be cached: Postgres's text output,
//! one entry per statement, parameters and role.

use super::plan::{CachePlan, Infer, ReadFormat, ReadPlan};
use crate::config::Config;
use crate::error::ApiError;
use crate::store::cache::{table_tag, Cache, EntryPolicy};
use crate::store::pools::session::Reset;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::statements::text::Query;
use ferry_shared::api::CacheMode;
use serde_json::Value;
use std::sync::Arc;

/// A `/sql` read cached for `ttl_s` seconds, dropped when one of `tables` changes (checked as
/// `cache.tables` is); with no tables named, on those Postgres says it reads
/// (`read::inferred`). Its entry is told apart from a `/v1` read of the same statement, and
/// from the other row shape, by the fingerprint.
/// `role`: the Neon token's `postgres_url` (None: `postgres.url`'s role). Entries are the
/// role's own: a token whose role may read less never gets what another role's read filled.
/// `identity`: the end user it runs as (the driver's `authToken`): entries are theirs alone.
pub(crate) fn text_read(
    config: &Config,
    query: Query,
    ttl_s: u64,
    tables: &[String],
    role: Option<&str>,
    identity: Option<Arc<SessionIdentity>>,
) -> Result<ReadPlan, ApiError> {
    let Query {
        sql,
        params,
        array_mode,
    } = query;
    let limits = config.limits();
    limits.ttl("Ferry-Cache-TTL", ttl_s)?;
    let tables = super::plan::tables(config, &[], tables, "Ferry-Cache-Tables")?;
    let params: Vec<Value> = params
        .into_iter()
        .map(|p| p.map_or(Value::Null, Value::String))
        .collect();
    let shape = if array_mode { "text:array" } else { "text" };
    let who = role
        .and_then(crate::store::postgres::login_role)
        .unwrap_or_default();
    // An end user's read is theirs alone: their role and claims are in the fingerprint.
    let fingerprint = match &identity {
        Some(user) => {
            let [a, r, c] = user.scope();
            Cache::fingerprint_in(&[shape, &who, a, r, c], &sql, &params)
        }
        None => Cache::fingerprint_in(&[shape, &who], &sql, &params),
    };
    let cache = CachePlan {
        key: Cache::logical_key(&fingerprint, None),
        fingerprint,
        entry: EntryPolicy {
            ttl_s,
            swr_s: 0,
            stale_if_error_s: 0,
        },
        tags: tables.iter().map(|t| table_tag(t)).collect(),
        mode: CacheMode::Default,
        rows_by: None,
    };
    let (cache, infer) = match tables.is_empty() {
        true => (None, Infer::Pending(Box::new(cache))),
        false => (Some(cache), Infer::No),
    };
    Ok(ReadPlan {
        sql,
        params,
        limits: limits.read,
        cache,
        infer,
        format: ReadFormat::Text {
            array_mode,
            role: role.map(Arc::from),
        },
        reset: Reset::Always,
        identity,
        after: None,
        batch: None,
    })
}

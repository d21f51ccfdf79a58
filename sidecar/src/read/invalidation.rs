//! What a write invalidates after its commit, checked before the write runs (as a read's plan
//! is): the caller's keys and tags, and the tables whose tags it drops.

use crate::config::{table_name, Config, MAX_TAGS};
use crate::error::ApiError;
use crate::store::cache::{table_reset_tag, table_tag, table_values_tag};
use ferry_shared::api::Invalidate;

/// What a write invalidates after its commit, checked: the caller's keys and tags, and for
/// each table both of its tags (the entries that declared it, and the keyspace rows read from
/// it). Returns (keys, tags).
pub(crate) fn plan(
    config: &Config,
    inv: Option<Invalidate>,
) -> Result<(Vec<String>, Vec<String>), ApiError> {
    let inv = inv.unwrap_or_default();
    let limits = config.limits();
    limits.invalidate_keys("invalidate.keys", &inv.keys)?;
    limits.tags("invalidate.tags", &inv.tags)?;
    if inv.tables.len() > MAX_TAGS {
        return Err(ApiError::invalid(
            "invalidate.tables",
            format!("at most {MAX_TAGS} tables"),
        ));
    }
    let mut tags = inv.tags;
    for (i, raw) in inv.tables.iter().enumerate() {
        let t = table_name(raw).ok_or_else(|| {
            ApiError::invalid(
                format!("invalidate.tables[{i}]"),
                "not a table name (schema.table or table, unquoted)",
            )
        })?;
        tags.push(table_tag(&t));
        tags.push(table_reset_tag(&t));
        tags.push(table_values_tag(&t));
    }
    Ok((inv.keys, tags))
}

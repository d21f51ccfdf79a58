//! Keyed reads (`/v1/batch/keyed`): rows of a configured keyspace by id. Each distinct id is a
//! read of the keyspace's statement (`WHERE key = ANY($1)` with `[id]`) under the entry
//! `<keyspace>:<id>`, and they go through the one engine together (`read::many`): lookups in one
//! Redis round trip, the misses as ONE statement with every missing id (the keyspace's
//! statement is its own batch form), each with its single flight and conditional write-back.

use super::grouped::BatchForm;
use super::many::{read_many, Bounds};
use super::plan::{CachePlan, ReadFormat, ReadPlan};
use crate::config::{table_name, Config};
use crate::error::ApiError;
use crate::read::lookup::Reads;
use crate::store::cache::{table_reset_tag, Cache, EntryPolicy};
use crate::store::pools::session::Reset;
use ferry_shared::api::{
    CacheMode, CacheStatus, KeyedRequest, KeyedResponse, KeyedResult, KeyedStatus,
};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// An id as it appears in cache keys and when matching rows: numbers and strings only.
fn id_text(id: &Value) -> Option<String> {
    match id {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// A keyed read, checked: the ids as given, which distinct read answers each, and the reads.
pub(crate) struct KeyedPlan {
    ids: Vec<Value>,
    /// For each id, its distinct read's index in `reads`.
    answered_by: Vec<usize>,
    reads: Vec<ReadPlan>,
    /// Each read's id as text, and the column a row carries it in.
    texts: Vec<String>,
    key_column: String,
}

/// Checks the request before any I/O (one config snapshot).
pub(crate) fn plan(config: &Config, req: KeyedRequest) -> Result<KeyedPlan, ApiError> {
    let ks = config.keyspaces.get(&req.keyspace).ok_or_else(|| {
        ApiError::invalid(
            "keyspace",
            format!("no configured keyspace named {:?}", req.keyspace),
        )
    })?;
    let mut tags = ks.tags.clone();
    // Rows of a watched table carry its reset tag: TRUNCATE, DDL or a change whose old id the
    // stream did not send drops them all.
    if let Some(t) = ks.table.as_deref().and_then(table_name) {
        tags.push(table_reset_tag(&t));
    }
    let limits = config.limits();
    limits.batch("ids", req.ids.len(), "ids")?;
    let form = Arc::new(BatchForm {
        sql: ks.sql.clone(),
        key_column: ks.key_column.clone(),
        element: true,
    });
    let mut distinct: HashMap<String, usize> = HashMap::new();
    let mut answered_by = Vec::with_capacity(req.ids.len());
    let mut reads = Vec::new();
    let mut texts = Vec::new();
    for (i, id) in req.ids.iter().enumerate() {
        let text = id_text(id).ok_or_else(|| {
            ApiError::invalid(
                format!("ids[{i}]"),
                "must be a number or a non-empty string",
            )
        })?;
        // The id becomes part of a cache key: the key rules apply to it.
        limits.key(format_args!("ids[{i}]"), &text)?;
        let next = reads.len();
        let read = *distinct.entry(text.clone()).or_insert(next);
        if read == next {
            let params = vec![Value::Array(vec![id.clone()])];
            reads.push(ReadPlan {
                cache: Some(CachePlan {
                    key: format!("{}:{text}", req.keyspace),
                    fingerprint: Cache::fingerprint(&ks.sql, &params),
                    entry: EntryPolicy {
                        ttl_s: ks.ttl_s,
                        ..Default::default()
                    },
                    tags: tags.clone(),
                    mode: CacheMode::default(),
                    rows_by: None,
                }),
                sql: ks.sql.clone(),
                params,
                limits: limits.read,
                format: ReadFormat::Json,
                identity: None,
                after: None,
                reset: Reset::Always,
                batch: Some(form.clone()),
                infer: Default::default(),
            });
            texts.push(text);
        }
        answered_by.push(read);
    }
    Ok(KeyedPlan {
        ids: req.ids,
        answered_by,
        reads,
        texts,
        key_column: ks.key_column.clone(),
    })
}

/// The whole keyed read: each id answered with its row (or not_found), in request order.
pub(crate) async fn run(
    state: &Reads,
    plan: KeyedPlan,
    bounds: Bounds,
) -> Result<KeyedResponse, ApiError> {
    let KeyedPlan {
        ids,
        answered_by,
        reads,
        texts,
        key_column,
    } = plan;
    let mut answers = Vec::with_capacity(reads.len());
    let read = read_many(state, reads.into_iter().map(Ok).collect(), bounds).await?;
    for (answer, text) in read.into_iter().zip(&texts) {
        // A read's failure fails the keyed read (it has no per-id error shape).
        let resp = answer?;
        // The row whose key is this id, as the id was given: Postgres also finds row 7 for
        // "07" or " 7", but no invalidation of row 7 reaches the entry `items:07`, so that
        // spelling is not found, alone or in a group.
        let rows = resp.rows.into_parsed().map_err(ApiError::internal)?;
        let row = rows
            .into_iter()
            .find(|r| r.get(&key_column).and_then(id_text).as_deref() == Some(text));
        let status = match (&row, resp.cache) {
            (None, _) => KeyedStatus::NotFound,
            (Some(_), CacheStatus::Hit | CacheStatus::Stale) => KeyedStatus::Hit,
            (Some(_), CacheStatus::Miss) => KeyedStatus::Miss,
            (Some(_), CacheStatus::Bypass) => KeyedStatus::Bypass,
        };
        answers.push((status, row, resp.age_ms));
    }
    let results = ids
        .into_iter()
        .zip(answered_by)
        .map(|(id, read)| {
            let (status, row, age_ms) = answers[read].clone();
            KeyedResult {
                id,
                status,
                row,
                age_ms,
            }
        })
        .collect();
    Ok(KeyedResponse { results })
}

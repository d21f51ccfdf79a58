//! Keyed batch reads (`/v1/batch/keyed`): rows of a configured keyspace by id, in one Redis
//! pipeline for the lookups, one Postgres query for all the misses, and one pipeline for the
//! write-backs. Runs as one blocking job.

use crate::config::Keyspace;
use crate::config::{table_name, Config, ReadLimits};
use crate::error::ApiError;
use crate::store::cache::{table_reset_tag, Cache, EntryPolicy, Lookup, Observed, Probe, Stored};
use crate::store::pools::Pools;
use crate::store::postgres::session::Reset;
use crate::store::statements::pooled;
use ferry_shared::api::{KeyedRequest, KeyedResponse, KeyedResult, KeyedStatus, Row};
use serde_json::Value;
use std::collections::HashMap;

/// An id as it appears in cache keys and when matching rows: numbers and strings only.
fn id_text(id: &Value) -> Option<String> {
    match id {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// A keyed read, checked: the keyspace, the ids as given and as text, the read bounds.
pub struct KeyedPlan {
    keyspace: String,
    ks: Keyspace,
    ids: Vec<Value>,
    texts: Vec<String>,
    limits: ReadLimits,
}

/// Checks the request before any I/O (one config snapshot).
pub fn plan(config: &Config, req: KeyedRequest) -> Result<KeyedPlan, ApiError> {
    let mut ks = config
        .keyspaces
        .get(&req.keyspace)
        .cloned()
        .ok_or_else(|| {
            ApiError::invalid(
                "keyspace",
                format!("no configured keyspace named {:?}", req.keyspace),
            )
        })?;
    // Rows of a watched table carry its reset tag: TRUNCATE or DDL drops them all.
    if let Some(t) = ks.table.as_deref().and_then(table_name) {
        ks.tags.push(table_reset_tag(&t));
    }
    let limits = config.limits();
    limits.batch("ids", req.ids.len(), "ids")?;
    let texts = req
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let text = id_text(id).ok_or_else(|| {
                ApiError::invalid(
                    format!("ids[{i}]"),
                    "must be a number or a non-empty string",
                )
            })?;
            // The id becomes part of a cache key: the key rules apply to it.
            limits.key(format_args!("ids[{i}]"), &text)?;
            Ok(text)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(KeyedPlan {
        keyspace: req.keyspace,
        ks,
        ids: req.ids,
        texts,
        limits: limits.read,
    })
}

/// The whole keyed read (blocking).
pub fn run(pools: &Pools, cache: &Cache, plan: KeyedPlan) -> Result<KeyedResponse, ApiError> {
    let KeyedPlan {
        keyspace,
        ks,
        ids,
        texts,
        limits,
    } = plan;
    // Each distinct id is looked up and fetched once, answered as often as it was asked.
    let mut first_seen: Vec<usize> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in texts.iter().enumerate() {
        index.entry(t.as_str()).or_insert_with(|| {
            first_seen.push(i);
            first_seen.len() - 1
        });
    }
    let keys: Vec<String> = first_seen
        .iter()
        .map(|&i| format!("{keyspace}:{}", texts[i]))
        .collect();
    // The keyspace's statement and the id: what the entry under `<keyspace>:<id>` holds.
    let fingerprints: Vec<String> = first_seen
        .iter()
        .map(|&i| Cache::fingerprint(&ks.sql, std::slice::from_ref(&ids[i])))
        .collect();
    let probes: Vec<Probe> = keys
        .iter()
        .zip(&fingerprints)
        .map(|(k, fp)| Probe {
            key: k,
            fingerprint: fp,
            tags: &ks.tags,
        })
        .collect();
    let lookups = cache.lookup_many(pools, &probes);

    let mut answers: Vec<Option<(KeyedStatus, Option<Row>, u64)>> = vec![None; keys.len()];
    let mut misses: Vec<(usize, Option<Observed>)> = Vec::new();
    for (u, lookup) in lookups.into_iter().enumerate() {
        match lookup {
            Lookup::Hit {
                mut rows, age_ms, ..
            } => {
                answers[u] = Some((KeyedStatus::Hit, rows.pop(), age_ms));
            }
            Lookup::Revalidate { observed, .. } | Lookup::Miss { observed, .. } => {
                misses.push((u, Some(observed)))
            }
            Lookup::Bypass => misses.push((u, None)),
        }
    }

    if !misses.is_empty() {
        let missing: Vec<Value> = misses
            .iter()
            .map(|(u, _)| ids[first_seen[*u]].clone())
            .collect();
        let missing = [Value::Array(missing)];
        let rows = pooled::query(pools, &ks.sql, &missing, limits, None, Reset::Always)?;
        let mut by_id: HashMap<String, Row> = HashMap::new();
        for row in rows {
            let id = row.get(&ks.key_column).and_then(id_text).ok_or_else(|| {
                ApiError::invalid(
                    "keyspace",
                    format!(
                        "the keyspace's rows have no usable key column {:?}",
                        ks.key_column
                    ),
                )
            })?;
            by_id.insert(id, row);
        }
        let policy = EntryPolicy {
            ttl_s: ks.ttl_s,
            ..Default::default()
        };
        let mut to_store: Vec<(usize, &Observed, Vec<Row>)> = Vec::new();
        for (u, observed) in &misses {
            let row = by_id.get(&texts[first_seen[*u]]).cloned();
            let status = match (&row, observed) {
                (None, _) => KeyedStatus::NotFound,
                (Some(_), None) => KeyedStatus::Bypass,
                (Some(r), Some(o)) => {
                    to_store.push((*u, o, vec![r.clone()]));
                    KeyedStatus::Miss
                }
            };
            answers[*u] = Some((status, row, 0));
        }
        let items: Vec<(&str, &Observed, &[Row])> = to_store
            .iter()
            .map(|(u, o, rows)| (keys[*u].as_str(), *o, rows.as_slice()))
            .collect();
        let stored = cache.store_many(pools, &items, &policy);
        for ((u, _, _), s) in to_store.iter().zip(stored) {
            if s == Stored::TooLarge {
                if let Some(a) = answers[*u].as_mut() {
                    a.0 = KeyedStatus::Bypass;
                }
            }
        }
    }

    let results = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (status, row, age_ms) = index
                .get(t.as_str())
                .and_then(|u| answers[*u].clone())
                .unwrap_or((KeyedStatus::NotFound, None, 0));
            crate::http::metrics::global().cache_outcome(match status {
                KeyedStatus::Hit => "hit",
                KeyedStatus::Miss => "miss",
                KeyedStatus::NotFound => "not_found",
                KeyedStatus::Bypass => "bypass",
            });
            KeyedResult {
                id: ids[i].clone(),
                status,
                row,
                age_ms,
            }
        })
        .collect();
    Ok(KeyedResponse { results })
}

//! Reads of one named query (or one keyspace) in one batch, answered by one statement: the
//! DataLoader pattern, done once, in the engine, so every door that batches reads gets it.
//!
//! A named query may declare its batch form (`batch_sql`, taking every parameter value as an
//! array in `$1`, and `batch_key`, the column that carries the parameter in each row):
//!
//! ```toml
//! [queries.item]
//! sql = "SELECT id, name FROM items WHERE id = $1"
//! batch_sql = "SELECT id, name FROM items WHERE id = ANY($1)"
//! batch_key = "id"
//! ```
//!
//! When a batch holds two or more reads of it that Redis cannot answer (misses, or reads
//! without a cache), they go to Postgres as that one statement; each read gets the rows whose
//! key is its parameter, in the statement's order, and goes on as if it had run on its own:
//! its single flight, its lease across sidecars, its write-back conditional on the versions
//! its lookup saw before the statement ran. A hundred made-up ids cost one index scan, not a
//! hundred statements. Should the statement fail, each read runs on its own as before.

use super::lookup::Reads;
use super::plan::ReadPlan;
use crate::config::{NamedQuery, ReadLimits};
use crate::error::ApiError;
use crate::store::cache::Lookup;
use ferry_shared::api::Row;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// A statement's batch form: `sql` takes every read's key value as an array in `$1`, and
/// `key_column` carries the value in each row.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BatchForm {
    pub sql: String,
    pub key_column: String,
    /// Each read's own parameter is already an array of its one value (a keyspace's statement
    /// runs alone as `sql` with `[id]`); otherwise the parameter is the value.
    pub element: bool,
}

impl BatchForm {
    /// The batch form a read of `q` with `params` may use: one parameter, and run as the
    /// sidecar's own role (an end user's reads keep their own statements).
    pub(crate) fn of(
        q: &NamedQuery,
        params: &[Value],
        as_end_user: bool,
    ) -> Option<Arc<BatchForm>> {
        match (&q.batch_sql, &q.batch_key, params.len(), as_end_user) {
            (Some(sql), Some(key), 1, false) => Some(Arc::new(BatchForm {
                sql: sql.clone(),
                key_column: key.clone(),
                element: false,
            })),
            _ => None,
        }
    }

    /// The key value a read with `params` stands for (None: it cannot be grouped).
    fn value<'p>(&self, params: &'p [Value]) -> Option<&'p Value> {
        match (params, self.element) {
            ([one], false) => Some(one),
            ([Value::Array(a)], true) if a.len() == 1 => a.first(),
            _ => None,
        }
    }
}

/// The text a key value compares by: a string as it is, anything else as JSON writes it (so
/// the parameter `7` and the column value `7` meet, and so do `"7"` and `7`).
fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// For each of `plans` (with its lookup), the rows its read gets from a grouped statement; None
/// where it was not grouped (a hit, a read of its own, a group of one) or the group of a named
/// query failed (each read then runs on its own, so one bad parameter fails only its read).
/// A keyspace's group that failed answers each of its reads with the failure: a keyed read
/// fails whole anyway, and running each id alone would only repeat the failure id by id.
pub(crate) async fn prefetch(
    state: &Reads,
    plans: &[&ReadPlan],
    lookups: &[Option<Lookup>],
    budget_bytes: usize,
) -> Vec<Option<Result<Vec<Row>, ApiError>>> {
    let mut out: Vec<Option<Result<Vec<Row>, ApiError>>> = vec![None; plans.len()];
    let mut groups: HashMap<&str, (Arc<BatchForm>, Vec<usize>)> = HashMap::new();
    for (i, (plan, lookup)) in plans.iter().zip(lookups).enumerate() {
        let Some(form) = &plan.batch else { continue };
        let goes_to_postgres = matches!(lookup, None | Some(Lookup::Miss { .. } | Lookup::Bypass));
        if goes_to_postgres && form.value(&plan.params).is_some() {
            groups
                .entry(form.sql.as_str())
                .or_insert_with(|| (form.clone(), Vec::new()))
                .1
                .push(i);
        }
    }
    for (form, members) in groups.into_values().filter(|(_, m)| m.len() >= 2) {
        let mut values: Vec<Value> = members
            .iter()
            .filter_map(|&i| form.value(&plans[i].params).cloned())
            .collect();
        values.dedup();
        let first = plans[members[0]];
        let limits = ReadLimits {
            max_rows: first.limits.max_rows.saturating_mul(members.len()),
            max_bytes: budget_bytes,
        };
        let statement = ReadPlan {
            sql: form.sql.clone(),
            params: vec![Value::Array(values)],
            limits,
            cache: None,
            format: Default::default(),
            identity: None,
            // As fresh as the freshest any member must see.
            after: members.iter().filter_map(|&i| plans[i].after).max(),
            reset: first.reset,
            batch: None,
            infer: Default::default(),
        };
        let rows = match super::postgres::run_query(state, statement).await {
            Ok(rows) => rows,
            Err(e) if form.element => {
                for &i in &members {
                    out[i] = Some(Err(e.clone()));
                }
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "a grouped read failed; each read runs on its own");
                continue;
            }
        };
        let mut by_key: HashMap<String, Vec<Row>> = HashMap::new();
        for row in rows {
            let key = row.get(&form.key_column).map(key_text).unwrap_or_default();
            by_key.entry(key).or_default().push(row);
        }
        for i in members {
            let Some(value) = form.value(&plans[i].params) else {
                continue;
            };
            out[i] = Some(Ok(by_key
                .get(&key_text(value))
                .cloned()
                .unwrap_or_default()));
        }
    }
    out
}

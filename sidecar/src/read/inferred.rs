//! Reads cached with no tables named: whether one can be cached and stay fresh by itself, and
//! on which tables it depends, from what Postgres's own parse of it says
//! (`store::postgres::analysis`), asked the first time a statement is seen (per role) and
//! remembered until the schema changes (`store::postgres::verdicts`, `schema`). `resolve` puts
//! the verdict into a read's plan: its tables' tags and the shape of what Postgres parsed go
//! into the entry, or the read is answered from Postgres with the reason
//! (`"cache": "bypass"`, `bypass_reason`). `ferry-sidecar --explain-cache 'SELECT ...'` says
//! the same for one statement.
//!
//! Only what the change stream can keep fresh is cached: every table the statement reads,
//! directly or through views and row-level-security policies, must be one the stream watches,
//! and every function it calls must be one of Postgres's own immutable ones (a stable one such
//! as `now()` or `current_setting`, or a volatile one, gives another answer with no write to
//! any table; a user-defined one may read tables the analysis cannot see). Materialized views (REFRESH is not in the
//! stream), foreign tables and the system catalogs are never cached.

use super::lookup::Reads;
use super::plan::{Infer, ReadFormat, ReadPlan};
use crate::config::Config;
use crate::error::ApiError;
use crate::store::cache::VALUES_EPOCH_TAG;
use crate::store::cache::{added_tag, guard_tag, moved_tag};
use crate::store::cache::{key_tag, table_tag, table_values_tag, value_key, values_tag, Cache};
use crate::store::postgres::analysis::{Analysis, Verdict};
use crate::store::postgres::top_n::TopN;
use crate::store::postgres::verdicts::Inferred;
use ferry_shared::api::CacheMode;

/// Postgres's own stable functions that read only the session's state, which Ferry makes the
/// same for every request of one role and end user (pinned at connect, reset after each
/// request, a read cannot change it: `set_config` is volatile and SET is refused up front), and
/// the role and end user are in every entry's scope. So a row-level-security policy reading the
/// end user's claims (`current_setting('request.jwt.claims')`) is cached per user.
const SESSION_STATE: [&str; 5] = [
    "current_setting(text)",
    "current_setting(text,boolean)",
    "current_schema()",
    "current_schemas(boolean)",
    "current_database()",
];

/// Why a read cannot be cached and stay fresh: the class `/metrics` counts it under
/// (`ferry_inferred_total{reason=...}`), and the sentence the caller reads.
pub(crate) type Why = (&'static str, String);

/// The tables a read depends on (`schema.table`), or every reason it cannot be cached.
pub(crate) fn cacheable(analysis: &Analysis, config: &Config) -> Result<Vec<String>, Vec<Why>> {
    let mut why: Vec<Why> = Vec::new();
    for o in &analysis.owned {
        why.push((
            "owned",
            format!(
                "it reads {o}, which the role requests run as owns: a request could redefine it"
            ),
        ));
    }
    for f in &analysis.functions {
        if !f.user && SESSION_STATE.contains(&f.name.as_str()) {
            continue;
        }
        // The operator vouches for it (cache.immutable_functions).
        if !f.qualified.is_empty() && config.cache.immutable_functions.contains(&f.qualified) {
            continue;
        }
        why.push(match f.user {
            true => (
                "function",
                format!(
                    "it calls {}: Postgres cannot say what it reads, nor vouch for its volatility \
                     (an operator may: cache.immutable_functions = [\"{}\"])",
                    f.describe(),
                    f.qualified
                ),
            ),
            false => (
                "function",
                format!(
                    "it calls {}: its result can change with no write to any table",
                    f.describe()
                ),
            ),
        });
    }
    let mut tables = Vec::new();
    for (name, kind) in &analysis.relations {
        let system = name.starts_with("pg_catalog.") || name.starts_with("information_schema.");
        match kind {
            _ if system => why.push(("catalog", format!("it reads the system catalog {name}"))),
            'v' => {}
            'r' | 'p' if config.watches(name) => tables.push(name.clone()),
            'r' | 'p' => why.push((
                "unwatched",
                format!(
                    "it reads {name}, which the change stream does not watch (add it to \
                     changes.tables)"
                ),
            )),
            'm' => why.push((
                "unwatched",
                format!(
                    "it reads the materialized view {name}: REFRESH is not in the change stream"
                ),
            )),
            'f' => why.push(("unwatched", format!("it reads the foreign table {name}"))),
            _ => why.push((
                "unwatched",
                format!("it reads {name}, which is not a table or a view"),
            )),
        }
    }
    if !config.changes.enabled {
        why.push((
            "changes_off",
            "the change stream is off ([changes] enabled = false): a write from outside Ferry \
             would never reach the cache"
                .into(),
        ));
    }
    match why.is_empty() {
        true => Ok(tables),
        false => Err(why),
    }
}

/// Puts what Postgres says of `plan`'s statement into its cache plan, when the plan asks for
/// inference (a cache policy with no tables and no key, the change stream on): cached on its
/// tables, its entry told apart by the shape of what Postgres parsed; or answered from
/// Postgres with the reason. The first read of a statement (per role, after each schema
/// change) asks Postgres on this worker's session; a read that finds it being asked is not
/// held up: it is answered from Postgres. `only-if-cached` with no cacheable verdict is
/// 404 `not_cached`, as a miss is.
pub(crate) async fn resolve(
    reads: &Reads,
    config: &Config,
    plan: &mut ReadPlan,
) -> Result<(), ApiError> {
    let Infer::Pending(mut cache) = std::mem::take(&mut plan.infer) else {
        return Ok(());
    };
    if plan.sql.len() > MAX_ANALYSED_SQL {
        let why = format!("longer than {MAX_ANALYSED_SQL} bytes: not analysed");
        return refuse(plan, cache.mode, ("not_analysed", why));
    }
    let role = match &plan.format {
        ReadFormat::Text { role, .. } => role.clone(),
        ReadFormat::Json => None,
    };
    let verdict = match reads.pools.inferred.get(role.as_ref(), &plan.sql) {
        Inferred::Known(v) => v,
        Inferred::Busy => {
            return refuse(plan, cache.mode, ("not_analysed", BEING_ASKED.into()));
        }
        Inferred::Ask(ticket) => {
            let asked = crate::store::statements::inference::ask(
                &reads.pools,
                &reads.blocking,
                role.as_deref(),
                &plan.sql,
                &config.changes.publication,
            )
            .await;
            match asked {
                Ok(v) => ticket.record(v),
                Err(e) => {
                    tracing::debug!(error = %e, "a read's dependencies not asked now");
                    return refuse(plan, cache.mode, ("not_analysed", NOT_ASKED.into()));
                }
            }
        }
    };
    let analysis = match &*verdict {
        Verdict::Analysed(a) => a,
        Verdict::Unknown(why) => {
            let why = format!("Postgres could not analyse it ({why})");
            return refuse(plan, cache.mode, ("not_analysed", why));
        }
    };
    match cacheable(analysis, config) {
        Ok(tables) => {
            // Entries of another definition of what it reads are never found again.
            cache.fingerprint =
                Cache::fingerprint_in(&["inferred", &analysis.shape, &cache.fingerprint], "", &[]);
            // A read of its tables' rows by columns' values depends on the rows of those
            // values: named by one of them, carrying the others' keys as tags (all moved by
            // the change stream), and dropped whole by a change whose old value was not sent,
            // TRUNCATE or DDL. Not for an end user (an entry named by a value would hold every
            // user's reads of it).
            match by_values(analysis, plan, reads) {
                Some(mut keys) => {
                    for v in &analysis.by_value {
                        cache.tags.push(table_values_tag(&v.table));
                        cache.tags.push(values_tag(&v.table, &v.column));
                    }
                    cache.tags.push(VALUES_EPOCH_TAG.to_string());
                    cache.key = keys.remove(0);
                    cache.tags.extend(keys.iter().map(|k| key_tag(k)));
                }
                None => {
                    cache.key = Cache::logical_key(&cache.fingerprint, None);
                    match top_n(analysis, &tables, plan, reads) {
                        // The first rows of its table in an index's order: it depends on those
                        // rows (named from them after the query, `engine::fill`), on a new row
                        // and on a change of the column; a change elsewhere in the table only
                        // keeps a fill under way from writing back (its guard).
                        Some(top) => {
                            let (t, c) = (&top.table, &top.column);
                            cache.tags.extend([
                                added_tag(t),
                                moved_tag(t, c),
                                values_tag(t, c),
                                table_values_tag(t),
                                VALUES_EPOCH_TAG.to_string(),
                                guard_tag(&table_tag(t)),
                            ]);
                            let seen = reads.cache.rows_seen(&cache.key, &cache.fingerprint);
                            cache.tags.extend(seen);
                            cache.rows_by = Some(top.clone());
                        }
                        None => cache.tags.extend(tables.iter().map(|t| table_tag(t))),
                    }
                }
            }
            cache.tags.sort();
            cache.tags.dedup();
            crate::metrics::global().inferred("cached", "");
            plan.cache = Some(*cache);
            Ok(())
        }
        Err(why) => {
            // Counted under the first reason's class; every reason said.
            let class = why.first().map_or("unwatched", |w| w.0);
            let text: Vec<String> = why.into_iter().map(|w| w.1).collect();
            refuse(plan, cache.mode, (class, text.join("; ")))
        }
    }
}

/// The keys of the values a read reads its tables by (sorted, each once), when Postgres
/// vouched that it reads every table so (`by_value`), the request gives each value, it is not
/// an end user's, and the stream's consumer moves the keys of values (a rolling deploy may run
/// one that does not).
fn by_values(analysis: &Analysis, plan: &ReadPlan, reads: &Reads) -> Option<Vec<String>> {
    if analysis.by_value.is_empty()
        || plan.identity.is_some()
        || !reads.cache.freshness().values_kept()
    {
        return None;
    }
    let mut keys = analysis
        .by_value
        .iter()
        .map(|v| Some(value_key(&v.table, &v.column, &v.value(&plan.params)?)))
        .collect::<Option<Vec<String>>>()?;
    keys.sort();
    keys.dedup();
    Some(keys)
}

/// The top-N read Postgres vouched for, when the request is not an end user's, its rows come
/// back as JSON (whose values name the keys), the stream's consumer moves what it depends on
/// and the cache can check a guard (not a cluster).
fn top_n<'a>(
    analysis: &'a Analysis,
    tables: &[String],
    plan: &ReadPlan,
    reads: &Reads,
) -> Option<&'a TopN> {
    let top = analysis.top_n.as_ref()?;
    let usable = plan.identity.is_none()
        && matches!(plan.format, ReadFormat::Json)
        && tables.len() == 1
        && tables[0] == top.table
        && reads.cache.freshness().values_kept()
        && reads.cache.rows_kept();
    usable.then_some(top)
}

/// The longest statement Postgres is asked about: an analysis costs Postgres in proportion to
/// the statement (a 50,000-element IN list took 0.6 s), and a longer read is rarely one worth
/// caching.
const MAX_ANALYSED_SQL: usize = 16 * 1024;

const BEING_ASKED: &str = "Postgres is being asked what it reads (the first read of this \
                           statement since startup or the last schema change)";
const NOT_ASKED: &str = "Postgres could not be asked what it reads now";

/// The read is answered from Postgres, and says why; `only-if-cached` never touches Postgres.
fn refuse(plan: &mut ReadPlan, mode: CacheMode, (class, why): Why) -> Result<(), ApiError> {
    crate::metrics::global().inferred("bypass", class);
    if mode == CacheMode::OnlyIfCached {
        return Err(ApiError::NeverCached { why });
    }
    plan.infer = Infer::Refused(why.into());
    Ok(())
}

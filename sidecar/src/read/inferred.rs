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
use crate::store::cache::{key_tag, table_tag, table_values_tag, value_key, values_tag, Cache};
use crate::store::postgres::analysis::{Analysis, Verdict};
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
    let watched = config.watched_tables();
    let mut tables = Vec::new();
    for (name, kind) in &analysis.relations {
        let system = name.starts_with("pg_catalog.") || name.starts_with("information_schema.");
        match kind {
            _ if system => why.push(("catalog", format!("it reads the system catalog {name}"))),
            'v' => {}
            'r' | 'p' if watched.contains(name) => tables.push(name.clone()),
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
                    cache.tags.extend(tables.iter().map(|t| table_tag(t)));
                    cache.key = Cache::logical_key(&cache.fingerprint, None);
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

/// `public.authors.id in $1 and public.posts.author_id in $1`.
fn described(values: &[crate::store::postgres::by_value::ByValue]) -> String {
    let each: Vec<String> = values.iter().map(|v| v.describe()).collect();
    each.join(" and ")
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

/// Each named read cached with no tables named (a `ttl_s`, no `tables`, the change stream
/// on): the tables Postgres says it reads, or why it will be answered uncached (a warning), as
/// `--check-config` and the startup log say them. Asked on `client`, `postgres.url`'s role.
pub(crate) fn report(
    config: &Config,
    client: &mut postgres::Client,
) -> Result<Vec<(bool, String)>, String> {
    let mut out = Vec::new();
    if !config.changes.enabled {
        return Ok(out);
    }
    for (name, q) in &config.queries {
        if q.ttl_s.is_none() || !q.tables.is_empty() {
            continue;
        }
        let publication = Some(config.changes.publication.as_str());
        let verdict = crate::store::postgres::analysis::analyse(client, &q.sql, publication)
            .map_err(|e| crate::store::postgres::failure::describe(&e))?;
        let line = match &verdict {
            Verdict::Unknown(why) => Err(format!("Postgres could not analyse it ({why})")),
            Verdict::Analysed(a) => cacheable(a, config)
                .map(|t| (t, a.by_value.as_slice()))
                .map_err(|why| why.into_iter().map(|w| w.1).collect::<Vec<_>>().join("; ")),
        };
        out.push(match line {
            Ok((t, _)) if t.is_empty() => {
                (false, format!("queries.{name}: cached (it reads no table)"))
            }
            Ok((_, values)) if !values.is_empty() => (
                false,
                format!(
                    "queries.{name}: cached by the value of {}, dropped by changes to the rows \
                     holding it",
                    described(values)
                ),
            ),
            Ok((t, _)) => (
                false,
                format!(
                    "queries.{name}: cached, dropped by any committed change to {}",
                    t.join(", ")
                ),
            ),
            Err(why) => (
                true,
                format!("queries.{name}: has ttl_s and no tables, but is answered uncached: {why}"),
            ),
        });
    }
    Ok(out)
}

/// What Ferry would do with `verdict`'s statement, in a few lines: what it reads and calls,
/// and whether a read of it cached with no tables named would be cached, on which tables.
pub(crate) fn explain(verdict: &Verdict, config: &Config) -> String {
    let a = match verdict {
        Verdict::Analysed(a) => a,
        Verdict::Unknown(why) => {
            return format!(
                "not analysed: {why}\ncache: could not be kept fresh (Postgres could not \
                 analyse it)"
            )
        }
    };
    let list = |items: Vec<String>| match items.is_empty() {
        true => "nothing".to_string(),
        false => items.join(", "),
    };
    let reads = a
        .relations
        .iter()
        .map(|(r, k)| format!("{r} ({})", kind(*k)))
        .collect();
    let calls = a.functions.iter().map(|f| f.describe()).collect();
    let cache = match (cacheable(a, config), &a.by_value) {
        (Ok(t), _) if t.is_empty() => {
            "cache: cached with no table named (it reads none)".to_string()
        }
        (Ok(_), values) if !values.is_empty() => format!(
            "cache: cached with no table named, by the value of {}: dropped only by a change \
             to a row holding that value (old or new), or one whose old value the stream does \
             not send, TRUNCATE or DDL (not for an end user's reads: their tables)",
            described(values)
        ),
        (Ok(t), _) => format!(
            "cache: cached with no table named, dropped by any committed change to {}",
            t.join(", ")
        ),
        (Err(why), _) => format!(
            "cache: could not be kept fresh by the change stream: {}",
            why.into_iter().map(|w| w.1).collect::<Vec<_>>().join("; ")
        ),
    };
    format!(
        "reads: {}\ncalls (other than Postgres's own immutable functions): {}\n\
         session reset after it, as a named query: {}\n{cache}",
        list(reads),
        list(calls),
        if verdict.plain() {
            "no, it is plain (as an end user: always)"
        } else {
            "yes"
        }
    )
}

fn kind(relkind: char) -> &'static str {
    match relkind {
        'r' => "table",
        'p' => "partitioned table",
        'v' => "view",
        'm' => "materialized view",
        'f' => "foreign table",
        _ => "other",
    }
}

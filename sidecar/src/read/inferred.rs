//! Whether a read can be cached and stay fresh by itself, and on which tables it depends, from
//! what Postgres's own parse of it says (`store::postgres::analysis`): the rule a read cached
//! without naming its tables is held to. `ferry-sidecar --explain-cache 'SELECT ...'` says it.
//!
//! Only what the change stream can keep fresh is cached: every table the statement reads,
//! directly or through views and row-level-security policies, must be one the stream watches,
//! and every function it calls must be one of Postgres's own immutable ones (a stable one such
//! as `now()` or `current_setting`, or a volatile one, gives another answer with no write to
//! any table; a user-defined one may read tables the analysis cannot see). Materialized views (REFRESH is not in the
//! stream), foreign tables and the system catalogs are never cached.

use crate::config::Config;
use crate::store::postgres::analysis::{Analysis, Verdict};

/// The tables a read depends on (`schema.table`), or why it cannot be cached.
pub(crate) fn cacheable(analysis: &Analysis, config: &Config) -> Result<Vec<String>, String> {
    if let Some(o) = analysis.owned.first() {
        return Err(format!(
            "it reads {o}, which the role requests run as owns: a request could redefine it"
        ));
    }
    if let Some(f) = analysis.functions.iter().find(|f| f.user) {
        return Err(format!(
            "it calls {}: Postgres cannot say what it reads, nor vouch for its volatility",
            f.describe()
        ));
    }
    if let Some(f) = analysis.functions.first() {
        return Err(format!(
            "it calls {}: its result can change with no write to any table",
            f.describe()
        ));
    }
    let watched = config.watched_tables();
    let mut tables = Vec::new();
    for (name, kind) in &analysis.relations {
        let system = name.starts_with("pg_catalog.") || name.starts_with("information_schema.");
        match kind {
            _ if system => return Err(format!("it reads the system catalog {name}")),
            'v' => {}
            'r' | 'p' if watched.contains(name) => tables.push(name.clone()),
            'r' | 'p' => {
                return Err(format!(
                    "it reads {name}, which the change stream does not watch (add it to \
                     changes.tables)"
                ))
            }
            'm' => {
                return Err(format!(
                    "it reads the materialized view {name}: REFRESH is not in the change stream"
                ))
            }
            'f' => return Err(format!("it reads the foreign table {name}")),
            _ => return Err(format!("it reads {name}, which is not a table or a view")),
        }
    }
    if !config.changes.enabled {
        return Err(
            "the change stream is off ([changes] enabled = false): a write from outside Ferry \
             would never reach the cache"
                .into(),
        );
    }
    Ok(tables)
}

/// What Ferry would do with `verdict`'s statement, in a few lines: what it reads and calls,
/// and whether a read of it cached with no tables named would be cached, on which tables.
pub(crate) fn explain(verdict: &Verdict, config: &Config) -> String {
    let a = match verdict {
        Verdict::Analysed(a) => a,
        Verdict::Unknown(why) => {
            return format!("not analysed: {why}\ncache: bypass (Postgres could not analyse it)")
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
    let cache = match cacheable(a, config) {
        Ok(t) if t.is_empty() => "cache: inferred, on no table (it reads none)".to_string(),
        Ok(t) => format!("cache: inferred, fresh on writes to {}", t.join(", ")),
        Err(why) => format!("cache: bypass: {why}"),
    };
    format!(
        "reads: {}\ncalls (not built-in immutable): {}\nsession reset after it: {}\n{cache}",
        list(reads),
        list(calls),
        if verdict.plain() {
            "no, as a named query (plain)"
        } else {
            "yes (it calls a volatile or user-defined function)"
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

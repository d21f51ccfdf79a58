//! Whether a read could be cached and stay fresh by itself, and on which tables it depends,
//! from what Postgres's own parse of it says (`store::postgres::analysis`): the rule a read
//! cached without naming its tables will be held to (not on the serving path yet: a cached
//! read is kept fresh by the tables it names). `ferry-sidecar --explain-cache 'SELECT ...'`
//! says it.
//!
//! Only what the change stream can keep fresh is cached: every table the statement reads,
//! directly or through views and row-level-security policies, must be one the stream watches,
//! and every function it calls must be one of Postgres's own immutable ones (a stable one such
//! as `now()` or `current_setting`, or a volatile one, gives another answer with no write to
//! any table; a user-defined one may read tables the analysis cannot see). Materialized views (REFRESH is not in the
//! stream), foreign tables and the system catalogs are never cached.

use crate::config::Config;
use crate::store::postgres::analysis::{Analysis, Verdict};

/// The tables a read depends on (`schema.table`), or every reason it cannot be cached.
pub(crate) fn cacheable(analysis: &Analysis, config: &Config) -> Result<Vec<String>, Vec<String>> {
    let mut why = Vec::new();
    for o in &analysis.owned {
        why.push(format!(
            "it reads {o}, which the role requests run as owns: a request could redefine it"
        ));
    }
    for f in &analysis.functions {
        why.push(match f.user {
            true => format!(
                "it calls {}: Postgres cannot say what it reads, nor vouch for its volatility",
                f.describe()
            ),
            false => format!(
                "it calls {}: its result can change with no write to any table",
                f.describe()
            ),
        });
    }
    let watched = config.watched_tables();
    let mut tables = Vec::new();
    for (name, kind) in &analysis.relations {
        let system = name.starts_with("pg_catalog.") || name.starts_with("information_schema.");
        match kind {
            _ if system => why.push(format!("it reads the system catalog {name}")),
            'v' => {}
            'r' | 'p' if watched.contains(name) => tables.push(name.clone()),
            'r' | 'p' => why.push(format!(
                "it reads {name}, which the change stream does not watch (add it to \
                 changes.tables)"
            )),
            'm' => why.push(format!(
                "it reads the materialized view {name}: REFRESH is not in the change stream"
            )),
            'f' => why.push(format!("it reads the foreign table {name}")),
            _ => why.push(format!("it reads {name}, which is not a table or a view")),
        }
    }
    if !config.changes.enabled {
        why.push(
            "the change stream is off ([changes] enabled = false): a write from outside Ferry \
             would never reach the cache"
                .into(),
        );
    }
    match why.is_empty() {
        true => Ok(tables),
        false => Err(why),
    }
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
    // Inference is not on the serving path yet: a cached read is kept fresh by the tables
    // (or keyspace key) it names, and this says which those should be.
    let cache = match cacheable(a, config) {
        Ok(t) if t.is_empty() => {
            "cache: could be kept fresh with no table (it reads none)".to_string()
        }
        Ok(t) => format!(
            "cache: could be kept fresh by writes to {} (name them in the read's cache.tables: \
             a cached read is kept fresh by the tables it names)",
            t.join(", ")
        ),
        Err(why) => format!(
            "cache: could not be kept fresh by the change stream: {}",
            why.join("; ")
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

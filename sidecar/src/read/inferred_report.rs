//! What `--check-config` and `--explain-cache` say of reads cached with no tables named:
//! the verdict `read::inferred` acts on, in words.

use crate::config::Config;
use crate::read::inferred::cacheable;
use crate::store::postgres::analysis::Verdict;
use crate::store::postgres::top_n::TopN;

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
                .map(|t| (t, a.by_value.as_slice(), a.top_n.as_ref()))
                .map_err(|why| why.into_iter().map(|w| w.1).collect::<Vec<_>>().join("; ")),
        };
        out.push(match line {
            Ok((t, _, _)) if t.is_empty() => {
                (false, format!("queries.{name}: cached (it reads no table)"))
            }
            Ok((_, _, Some(top))) => (false, format!("queries.{name}: cached by {}", ranked(top))),
            Ok((_, values, _)) if !values.is_empty() => (
                false,
                format!(
                    "queries.{name}: cached by the value of {}, dropped by changes to the rows \
                     holding it",
                    described(values)
                ),
            ),
            Ok((t, _, _)) => (
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
        (Ok(_), _) if a.top_n.is_some() => format!(
            "cache: cached with no table named, by {} (not for an end user's reads: their tables)",
            a.top_n.as_ref().map(ranked).unwrap_or_default()
        ),
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

/// What a top-N read is cached by, in words.
fn ranked(top: &TopN) -> String {
    format!(
        "the rows it returns, the first of {t} in the order of {c}: dropped only by a change to \
         one of them, a new row of {t}, a change of a row's {c}, TRUNCATE or DDL",
        t = top.table,
        c = top.column
    )
}

/// `public.authors.id in $1 and public.posts.author_id in $1`.
fn described(values: &[crate::store::postgres::by_value::ByValue]) -> String {
    let each: Vec<String> = values.iter().map(|v| v.describe()).collect();
    each.join(" and ")
}

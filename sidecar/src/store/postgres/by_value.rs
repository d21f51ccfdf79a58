//! Whether a read of one table reads only the rows whose column holds one value
//! (`WHERE post_id = $1`, `WHERE id = $1`): then its result depends on those rows alone, and a
//! cached copy is dropped by a change to a row with that value, old or new (`cache::value_key`,
//! moved by the change stream), not by a change to any row of the table.
//!
//! Postgres's planner says it, not the statement's text: the statement's generic plan (its
//! parameters unknown), with sequential and bitmap scans off so that any condition an index can
//! take is taken, must scan the table exactly once, by an index scan whose whole index
//! condition is `column = $n`. An index scan returns only rows that meet its index condition,
//! so every row the read can see holds `$n`. A second scan of the table (a self-join, a
//! subquery), an `OR`, an expression around the column or the parameter, or a cast all fail
//! the test, and the read depends on its table as any other.
//!
//! Only columns whose text the change stream and the request agree on: integers (the request's
//! number or numeric string, written as Postgres writes it) and `text` of a deterministic
//! collation (under a case-insensitive one, `'ALICE'` finds row `alice`). No plan with a
//! subquery (an InitPlan's output is printed `$n` too). Any replica identity: a change whose
//! old value the stream did not send drops every read by the column (`cache::values_tag`).

use serde_json::Value;
use tokio_postgres::{Client, SimpleQueryMessage};

/// The longest value that names an entry (as `limits.key` bounds a caller's key): a read by a
/// longer one, or one with a control character, depends on its table, so such a value in a
/// change moves no key.
pub(crate) const MAX_VALUE_KEY: usize = 256;

/// Whether `value` can name an entry (`value_key`).
pub(crate) fn names_an_entry(value: &str) -> bool {
    value.len() <= MAX_VALUE_KEY && !value.chars().any(char::is_control)
}

/// A read of `table` (`schema.name`) by the value of `column` in parameter `param` (0-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ByValue {
    pub table: String,
    /// The column's name as the change stream sends it (unquoted).
    pub column: String,
    pub param: usize,
    /// The column is an integer (else text).
    pub integer: bool,
}

impl ByValue {
    /// The value as the change stream writes it, from the read's parameters; None when it
    /// cannot be told for certain (then the read depends on its table).
    pub(crate) fn value(&self, params: &[Value]) -> Option<String> {
        let v = match (params.get(self.param)?, self.integer) {
            (Value::Number(n), true) => n.as_i64()?.to_string(),
            (Value::String(s), true) => s.trim().parse::<i64>().ok()?.to_string(),
            (Value::String(s), false) => s.clone(),
            _ => return None,
        };
        names_an_entry(&v).then_some(v)
    }
}

/// The columns of `table` whose values the stream sends (the publication `$2` publishes them:
/// no generated column, none left out of a column list) and the stream and requests agree on
/// (Postgres's own integer and text types): (the name as the plan prints it, the name,
/// integer, its type, the table).
const COLUMNS: &str = "
SELECT quote_ident(a.attname), a.attname::text, t.typname IN ('int2', 'int4', 'int8'),
       a.atttypid, c.oid
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
   AND a.attgenerated = ''
  JOIN pg_type t ON t.oid = a.atttypid AND t.typnamespace = 'pg_catalog'::regnamespace
  LEFT JOIN pg_collation co ON co.oid = a.attcollation
  JOIN pg_publication_tables p ON p.pubname = $2 AND p.schemaname = n.nspname
   AND p.tablename = c.relname AND a.attname = ANY(p.attnames)
 WHERE n.nspname || '.' || c.relname = $1 AND c.relkind = 'r'
   AND t.typname IN ('int2', 'int4', 'int8', 'text')
   AND (a.attcollation = 0 OR co.collisdeterministic)";

/// One column of [`COLUMNS`]: the name as the plan prints it, the name, integer, its type, the
/// table's oid.
type ColumnRow = (String, String, bool, u32, u32);

fn column_rows(rows: &[tokio_postgres::Row]) -> Vec<ColumnRow> {
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// The planner's settings for the probe (`SET LOCAL`: gone with the caller's rollback).
const PLANNER: &str = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
                       SET LOCAL plan_cache_mode = force_generic_plan";

/// The probe's statements: one per message (extended protocol), so the caller's text cannot
/// end the transaction. Prepared statements outlive a rollback: deallocated after (and the
/// session is reset after the analysis anyway).
fn probe(sql: &str, params: usize) -> (String, String) {
    let explain = match params {
        0 => "EXPLAIN (FORMAT JSON) EXECUTE ferry_value_probe".to_string(),
        _ => format!(
            "EXPLAIN (FORMAT JSON) EXECUTE ferry_value_probe({})",
            vec!["NULL"; params].join(", ")
        ),
    };
    (format!("PREPARE ferry_value_probe AS {sql}\n"), explain)
}
const DEALLOCATE: &str = "DEALLOCATE ferry_value_probe";

/// Asks the planner, inside the caller's transaction (rolled back after: the settings are
/// `SET LOCAL`), whether `sql` (with parameters of types `params`) reads `table` by one
/// column's value, as the stream of `publication` sends it. Any refusal is "no": the read then
/// depends on the whole table.
pub(crate) async fn by_value(
    client: &Client,
    sql: &str,
    params: &[u32],
    table: &str,
    publication: &str,
) -> Option<ByValue> {
    let columns = column_rows(&client.query(COLUMNS, &[&table, &publication]).await.ok()?);
    client.batch_execute(PLANNER).await.ok()?;
    let (prepare, explain) = probe(sql, params.len());
    client.execute(prepare.as_str(), &[]).await.ok()?;
    let plan = client.simple_query(&explain).await;
    let _ = client.batch_execute(DEALLOCATE).await;
    let text = plan.ok()?.into_iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })?;
    judge(&columns, &text, params, table)
}

/// [`by_value`] on a blocking session (`--explain-cache`, `--check-config`).
pub(crate) fn by_value_blocking(
    client: &mut postgres::Client,
    sql: &str,
    params: &[u32],
    table: &str,
    publication: &str,
) -> Option<ByValue> {
    let columns = column_rows(&client.query(COLUMNS, &[&table, &publication]).ok()?);
    client.batch_execute(PLANNER).ok()?;
    let (prepare, explain) = probe(sql, params.len());
    client.execute(prepare.as_str(), &[]).ok()?;
    let plan = client.simple_query(&explain);
    let _ = client.batch_execute(DEALLOCATE);
    let text = plan.ok()?.into_iter().find_map(|m| match m {
        postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })?;
    judge(&columns, &text, params, table)
}

/// What the plan (`EXPLAIN (FORMAT JSON)` of the generic plan) says: a read of `table` by one
/// column's value, or None.
fn judge(columns: &[ColumnRow], plan: &str, types: &[u32], table: &str) -> Option<ByValue> {
    // `schema.name` joined is ambiguous (schema `a.b`, table `c`; schema `a`, table `b.c`).
    let oids: std::collections::BTreeSet<u32> = columns.iter().map(|c| c.4).collect();
    if oids.len() > 1 {
        return None;
    }
    let plan: Value = serde_json::from_str(plan).ok()?;
    let mut scans = Vec::new();
    let mut subplans = false;
    scans_of(&plan[0]["Plan"], &mut scans, &mut subplans);
    // A subquery's output is printed as `$n` too (an InitPlan's): no plan with one is trusted.
    let ([only], false) = (scans.as_slice(), subplans) else {
        return None;
    };
    let by_index = matches!(
        only["Node Type"].as_str(),
        Some("Index Scan" | "Index Only Scan")
    );
    if !by_index {
        return None;
    }
    let (printed, n) = only["Index Cond"]
        .as_str()?
        .strip_prefix('(')?
        .strip_suffix(')')?
        .split_once(" = $")?;
    let n: usize = n.parse().ok()?;
    let column = columns.iter().find(|c| c.0 == printed)?;
    // The parameter of the column's own type: another (`$1::name`, which Postgres truncates
    // to 63 bytes) could find rows whose value is not the request's text.
    if types.get(n.wrapping_sub(1)) != Some(&column.3) {
        return None;
    }
    (1..=types.len()).contains(&n).then(|| ByValue {
        table: table.to_string(),
        column: column.1.clone(),
        param: n - 1,
        integer: column.2,
    })
}

/// Every node of `plan` that scans a relation; and whether any is a subquery's plan.
fn scans_of<'a>(plan: &'a Value, into: &mut Vec<&'a Value>, subplans: &mut bool) {
    if plan.get("Relation Name").is_some() {
        into.push(plan);
    }
    let relationship = plan["Parent Relationship"].as_str();
    if plan.get("Subplan Name").is_some() || matches!(relationship, Some("InitPlan" | "SubPlan")) {
        *subplans = true;
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        scans_of(child, into, subplans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_value_is_written_as_the_stream_writes_it_or_not_at_all() {
        let int = ByValue {
            table: "public.posts".into(),
            column: "id".into(),
            param: 0,
            integer: true,
        };
        assert_eq!(int.value(&[json!(7)]).as_deref(), Some("7"));
        assert_eq!(int.value(&[json!("007")]).as_deref(), Some("7"));
        assert_eq!(int.value(&[json!(7.5)]), None);
        assert_eq!(int.value(&[json!(null)]), None);
        assert_eq!(int.value(&[]), None);
        let text = ByValue {
            integer: false,
            ..int
        };
        assert_eq!(text.value(&[json!("a b")]).as_deref(), Some("a b"));
        assert_eq!(text.value(&[json!(7)]), None);
        assert_eq!(text.value(&[json!("a\nb")]), None);
        assert_eq!(text.value(&[json!("x".repeat(257))]), None);
    }
}

//! Whether a read is the first rows of one table in the order of a one-column index (`SELECT
//! id, title FROM posts ORDER BY id DESC LIMIT 10`): then its result changes only when one of
//! the rows it returned changes or goes (the keys of their values of the column, moved by the
//! change stream), a row is added (the table's `added_tag`), or a row's value of the column
//! changes (the column's `moved_tag`; its `values_tag` when the old value was not sent). A
//! write to any other row leaves it as it is.
//!
//! The planner says it: the generic plan (sequential and bitmap scans off) is a Limit right
//! over one index scan of the table, with no index condition and no filter, by an index on one
//! column (no expression, no predicate) whose value the stream and the request agree on (as
//! for reads by a value, `by_value::COLUMNS`), and the column is among the result's (its rows
//! name the keys). An OFFSET is not printed in the plan: Postgres's parse tree says it (the
//! probe function's body; no view, whose tree is its own), and a read with one is refused (a
//! row that goes before the window would move the window). The generic plan with sequential
//! scans off takes an index even for a read with no ORDER BY, which runs in heap order: asked
//! again without index scans, the plan must sort by the column alone, under its own collation.
//! After an attacker's review (2026-12-05): no ORDER BY, an OFFSET in a view, an order under a
//! case-insensitive collation.
//!
//! The rows it returned are known only after it runs: how its fill stays fresh is in
//! `read::engine` (the keys read after the query, the write-back guarded by the table's tag).

use super::ask::Ask;
use super::by_value::{column_rows, explained, scans_of, ColumnRow, COLUMNS, PLANNER};
use serde_json::Value;

/// A top-N read of `table` in the order of `column`, returned in the result's `field`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopN {
    pub table: String,
    pub column: String,
    /// The result's column holding it (unique among the result's names).
    pub field: String,
    /// The column is an integer (else text).
    pub integer: bool,
}

/// The one key column of index `$1` in schema `$2`, for a plain index on one column. (Its
/// collation is the order's, which `sorts_by` finds to be the column's own, deterministic: an
/// order under a case-insensitive one, where `A` and `a` tie in the heap's order, is printed
/// with its COLLATE and refused.)
const INDEX_COLUMN: &str = "
SELECT a.attname::text
  FROM pg_index i
  JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = ic.relnamespace
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
 WHERE ic.relname = $1 AND n.nspname = $2 AND i.indnatts = 1 AND i.indnkeyatts = 1
   AND i.indexprs IS NULL AND i.indpred IS NULL";

/// Whether the statement (the analysis's probe function, in this transaction) has an OFFSET
/// anywhere in its parse tree.
const OFFSET: &str = "
SELECT coalesce(bool_or(f.prosqlbody::text ~ ':limitOffset [^<]'), true)
  FROM pg_proc f
 WHERE f.proname = 'ferry_plain_probe' AND f.pronamespace = pg_my_temp_schema()";

/// Asks, inside the analysis's transaction (its probe function made; rolled back after),
/// whether `sql` (parameters of types `params`, result columns named `fields`) is a top-N read
/// of `table`, the only table it reads, as the stream of `publication` sends it.
pub(crate) async fn top_n(
    client: &mut impl Ask,
    sql: &str,
    (params, fields): (&[u32], &[String]),
    table: &str,
    publication: &str,
) -> Option<TopN> {
    let tables = [table.to_string()];
    let offset = client.query(OFFSET, &[]).await.ok()?;
    if offset.first().is_none_or(|r| r.get::<_, bool>(0)) {
        return None;
    }
    let columns = column_rows(
        &client
            .query(COLUMNS, &[&&tables[..], &publication])
            .await
            .ok()?,
    );
    client.batch(PLANNER).await.ok()?;
    let plan = explained(client, sql, params.len()).await?;
    let scan = shape(&plan, table)?;
    let (index, schema) = (scan["Index Name"].as_str()?, scan["Schema"].as_str()?);
    let rows = client.query(INDEX_COLUMN, &[&index, &schema]).await.ok()?;
    let [row] = rows.as_slice() else {
        return None;
    };
    let column: String = row.get(0);
    let top = judge(&columns, &plan, scan, &column, fields, table)?;
    // The index gives the order only where the statement asks for it: without index scans,
    // the plan must sort by the column (a read with no ORDER BY runs in heap order).
    client.batch(BY_SORT).await.ok()?;
    let sorted = explained(client, sql, params.len()).await?;
    sorts_by(&sorted, scan["Alias"].as_str()?, &columns, &top)?.then_some(top)
}

/// The planner's settings for the second question: no index, so an order must be a sort.
const BY_SORT: &str = "SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off; \
                       SET LOCAL enable_seqscan = on";

/// Whether a plan without index scans is a Limit right over a sort by `top`'s column alone
/// (either way, NULLs either end; no collation of its own).
fn sorts_by(plan: &Value, alias: &str, columns: &[ColumnRow], top: &TopN) -> Option<bool> {
    let root = &plan[0]["Plan"];
    let [sort] = root["Plans"].as_array()?.as_slice() else {
        return Some(false);
    };
    let [key] = sort["Sort Key"].as_array()?.as_slice() else {
        return Some(false);
    };
    let printed = &columns
        .iter()
        .find(|c| c.table == top.table && c.name == top.column)?
        .printed;
    let key = key.as_str()?;
    let key = key
        .strip_suffix(" NULLS FIRST")
        .or(key.strip_suffix(" NULLS LAST"))
        .unwrap_or(key);
    let key = key.strip_suffix(" DESC").unwrap_or(key);
    let quoted = format!("\"{}\"", alias.replace('"', "\"\""));
    let named = key == printed
        || [alias, quoted.as_str()]
            .iter()
            .any(|a| key == format!("{a}.{printed}"));
    Some(root["Node Type"] == "Limit" && sort["Node Type"] == "Sort" && named)
}

/// The index scan of a plan that is a Limit right over it, of `table`, with no condition, no
/// filter and no subplan.
fn shape<'a>(plan: &'a Value, table: &str) -> Option<&'a Value> {
    let root = &plan[0]["Plan"];
    let mut scans = Vec::new();
    let mut subplans = false;
    scans_of(root, &mut scans, &mut subplans);
    let children = root["Plans"].as_array()?;
    let ([scan], [child], false) = (scans.as_slice(), children.as_slice(), subplans) else {
        return None;
    };
    let plain = root["Node Type"] == "Limit"
        && std::ptr::eq(*scan, child)
        && matches!(
            scan["Node Type"].as_str(),
            Some("Index Scan" | "Index Only Scan")
        )
        && scan.get("Index Cond").is_none()
        && scan.get("Filter").is_none()
        && format!(
            "{}.{}",
            scan["Schema"].as_str()?,
            scan["Relation Name"].as_str()?
        ) == table;
    plain.then_some(*scan)
}

/// The column's place in the result: the Limit's output names it (`alias.column`, or bare) at the
/// place of a result column whose name no other shares.
fn judge(
    columns: &[ColumnRow],
    plan: &Value,
    scan: &Value,
    column: &str,
    fields: &[String],
    table: &str,
) -> Option<TopN> {
    let c = columns
        .iter()
        .find(|c| c.table == table && c.name == column)?;
    let alias = scan["Alias"].as_str()?;
    let quoted = format!("\"{}\"", alias.replace('"', "\"\""));
    let output = plan[0]["Plan"]["Output"].as_array()?;
    // Bare when the plan reads one relation (Postgres qualifies output only past one).
    let place = output.iter().position(|o| {
        let o = o.as_str().unwrap_or_default();
        o == c.printed
            || [alias, quoted.as_str()]
                .iter()
                .any(|a| o == format!("{a}.{}", c.printed))
    })?;
    let field = fields.get(place)?;
    if fields.iter().filter(|f| *f == field).count() != 1 || output.len() != fields.len() {
        return None;
    }
    Some(TopN {
        table: table.to_string(),
        column: c.name.clone(),
        field: field.clone(),
        integer: c.integer,
    })
}

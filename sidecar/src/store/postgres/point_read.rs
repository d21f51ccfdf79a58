//! Whether a read of one table is a point read by its one-column primary key (`WHERE id = $1`):
//! then its result depends on that row alone, and a cached copy is dropped by a change to that
//! row (`cache::row_key`, moved by the change stream), not by a change to any row of the table.
//!
//! Postgres's planner says it, not the statement's text: the statement's generic plan (its
//! parameters unknown), with sequential and bitmap scans off so that any condition an index can
//! take is taken, must scan the table exactly once, by an index scan on the primary key whose
//! whole index condition is `key = $n`. An index scan returns only rows that meet its index
//! condition, so every row the read can see is row `$n`. A second scan of the table (a
//! self-join, a subquery), an `OR`, an expression around the parameter or a cast all fail the
//! test, and the read depends on its table as any other.
//!
//! Only keys whose text the change stream and the request agree on: integers (the request's
//! number or numeric string, written as Postgres writes it) and `text` of a deterministic
//! collation. No plan with a subquery (an InitPlan's output is printed `$n` too). The table's
//! replica identity must be its primary key (the default), the column the stream sends.

use serde_json::Value;
use tokio_postgres::{Client, SimpleQueryMessage};

/// A point read: of `table` (`schema.name`), the row whose key is parameter `param` (0-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Point {
    pub table: String,
    pub param: usize,
    /// The key is an integer (else text).
    pub integer: bool,
}

impl Point {
    /// The row's key as the change stream writes it, from the read's parameters; None when it
    /// cannot be told for certain (then the read depends on its table).
    pub(crate) fn row_id(&self, params: &[Value]) -> Option<String> {
        let id = match (params.get(self.param)?, self.integer) {
            (Value::Number(n), true) => n.as_i64()?.to_string(),
            (Value::String(s), true) => s.trim().parse::<i64>().ok()?.to_string(),
            (Value::String(s), false) => s.clone(),
            _ => return None,
        };
        // A key is bounded like a caller's (`limits.key`): a longer one is not worth a row key.
        (id.len() <= 256 && !id.chars().any(char::is_control)).then_some(id)
    }
}

/// The primary key of `table` when it is one column of a type the stream and requests agree
/// on, and the table's replica identity is that key: (index name, column as an identifier,
/// integer). A text key's collation must be deterministic: under a case-insensitive one,
/// `'ALICE'` finds row `alice`, and a change to it moves `alice`'s key only.
const KEY: &str = "
SELECT quote_ident(ic.relname), quote_ident(a.attname), t.typname IN ('int2', 'int4', 'int8')
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary AND i.indnatts = 1
  JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
  JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_collation co ON co.oid = a.attcollation
 WHERE n.nspname || '.' || c.relname = $1 AND c.relkind = 'r' AND c.relreplident = 'd'
   AND t.typname IN ('int2', 'int4', 'int8', 'text')
   AND (a.attcollation = 0 OR co.collisdeterministic)";

/// Asks the planner, inside the caller's transaction (rolled back after: the settings are
/// `SET LOCAL`), whether `sql` (with `params` parameters) reads `table` by its key alone.
/// Any refusal is "no": the read then depends on the whole table.
pub(crate) async fn point_read(
    client: &Client,
    sql: &str,
    params: usize,
    table: &str,
) -> Option<Point> {
    let key = client.query_opt(KEY, &[&table]).await.ok()??;
    let (index, column, integer): (String, String, bool) = (key.get(0), key.get(1), key.get(2));
    client
        .batch_execute(
            "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
             SET LOCAL plan_cache_mode = force_generic_plan",
        )
        .await
        .ok()?;
    // One statement per message (extended protocol): the caller's text cannot end the
    // transaction. Prepared statements outlive a rollback: deallocated below (and the session
    // is reset after the analysis anyway).
    client
        .execute(
            format!("PREPARE ferry_point_probe AS {sql}\n").as_str(),
            &[],
        )
        .await
        .ok()?;
    let args = vec!["NULL"; params].join(", ");
    let explain = match params {
        0 => "EXPLAIN (FORMAT JSON) EXECUTE ferry_point_probe".to_string(),
        _ => format!("EXPLAIN (FORMAT JSON) EXECUTE ferry_point_probe({args})"),
    };
    let plan = client.simple_query(&explain).await;
    let _ = client.batch_execute("DEALLOCATE ferry_point_probe").await;
    let text = plan.ok()?.into_iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })?;
    let plan: Value = serde_json::from_str(&text).ok()?;
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
    if !by_index || only["Index Name"].as_str() != Some(index.as_str()) {
        return None;
    }
    let cond = only["Index Cond"].as_str()?;
    let n: usize = cond
        .strip_prefix(&format!("({column} = $"))?
        .strip_suffix(')')?
        .parse()
        .ok()?;
    (1..=params).contains(&n).then(|| Point {
        table: table.to_string(),
        param: n - 1,
        integer,
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
    fn a_row_id_is_written_as_the_stream_writes_it_or_not_at_all() {
        let int = Point {
            table: "public.posts".into(),
            param: 0,
            integer: true,
        };
        assert_eq!(int.row_id(&[json!(7)]).as_deref(), Some("7"));
        assert_eq!(int.row_id(&[json!("007")]).as_deref(), Some("7"));
        assert_eq!(int.row_id(&[json!(7.5)]), None);
        assert_eq!(int.row_id(&[json!(null)]), None);
        assert_eq!(int.row_id(&[]), None);
        let text = Point {
            integer: false,
            ..int
        };
        assert_eq!(text.row_id(&[json!("a b")]).as_deref(), Some("a b"));
        assert_eq!(text.row_id(&[json!(7)]), None);
        assert_eq!(text.row_id(&[json!("a\nb")]), None);
    }
}

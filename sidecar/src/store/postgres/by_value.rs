//! Whether a read reads only the rows whose column holds one value, in every table it reads
//! (`WHERE post_id = $1`, `WHERE id = $1`, a view joining an author to their posts read by
//! `author_id = $1`): then its result depends on those rows alone, and a cached copy is
//! dropped by a change to a row with that value, old or new (`cache::value_key`, moved by the
//! change stream), not by a change to any row of the tables.
//!
//! Postgres's planner says it, not the statement's text: the statement's generic plan (its
//! parameters unknown), with sequential and bitmap scans off so that any condition an index can
//! take is taken, must scan every table it reads by an index scan whose whole index condition
//! is `column = $n`. An index scan returns only rows that meet its index condition, so every
//! row the read can see holds `$n`, and the result, however the scans' rows are joined,
//! grouped or filtered, is made of those rows alone. The planner carries an equality across a
//! join (`a.id = $1` and `p.author_id = a.id` give `p.author_id = $1`); a scan whose condition
//! is the other side of a join (`p.author_id = a.id`), an `OR`, an expression around the
//! column or the parameter, or a cast fails the test, and the read depends on its tables as
//! any other.
//!
//! Only columns whose text the change stream and the request agree on: integers (the request's
//! number or numeric string, written as Postgres writes it) and `text` of a deterministic
//! collation (under a case-insensitive one, `'ALICE'` finds row `alice`). No plan with a
//! subquery (an InitPlan's output is printed `$n` too). Any replica identity: a change whose
//! old value the stream did not send drops every read by the column (`cache::values_tag`), so
//! a column outside the identity is best read by value under `REPLICA IDENTITY FULL`.

use super::ask::Ask;
use serde_json::Value;
use tokio_postgres::SimpleQueryMessage;

/// The longest value that names an entry (as `limits.key` bounds a caller's key): a read by a
/// longer one, or one with a control character, depends on its table, so such a value in a
/// change moves no key.
pub(crate) const MAX_VALUE_KEY: usize = 256;

/// Whether `value` can name an entry (`value_key`).
pub(crate) fn names_an_entry(value: &str) -> bool {
    value.len() <= MAX_VALUE_KEY && !value.chars().any(char::is_control)
}

/// `v` (a request's parameter, or a value of a row Postgres returned) as the change stream
/// writes the value of an integer (`integer`) or text column; None when it cannot be told for
/// certain, or names no entry.
pub(crate) fn key_text(v: &Value, integer: bool) -> Option<String> {
    let v = match (v, integer) {
        (Value::Number(n), true) => n.as_i64()?.to_string(),
        (Value::String(s), true) => s.trim().parse::<i64>().ok()?.to_string(),
        (Value::String(s), false) => s.clone(),
        _ => return None,
    };
    names_an_entry(&v).then_some(v)
}

/// A read of `table` (`schema.name`) by the value of `column` in parameter `param` (0-based).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ByValue {
    pub table: String,
    /// The column's name as the change stream sends it (unquoted).
    pub column: String,
    pub param: usize,
    /// The column is an integer (else text).
    pub integer: bool,
    /// The stream sends the column's old value with every UPDATE and DELETE (it is in the
    /// table's replica identity): else every such change drops every read by the column.
    pub old_sent: bool,
}

impl ByValue {
    /// The value as the change stream writes it, from the read's parameters; None when it
    /// cannot be told for certain (then the read depends on its table).
    pub(crate) fn value(&self, params: &[Value]) -> Option<String> {
        key_text(params.get(self.param)?, self.integer)
    }

    /// `public.posts.author_id in $1`, for what Ferry says of a read.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("{}.{} in ${}", self.table, self.column, self.param + 1);
        if !self.old_sent {
            s.push_str(
                " (outside the table's replica identity: any UPDATE or DELETE of the table drops \
                 it; REPLICA IDENTITY FULL would not)",
            );
        }
        s
    }
}

/// The tables of a read that may read them by values: it calls no function but Postgres's own
/// immutable ones (`functions`: the others it calls) and reads tables, through views or not,
/// and nothing else (`relations`: each with its `pg_class.relkind`).
pub(crate) fn candidate<T>(relations: &[(String, char)], functions: &[T]) -> Option<Vec<String>> {
    let only_tables = relations.iter().all(|(_, k)| matches!(k, 'r' | 'v'));
    let tables: Vec<String> = relations
        .iter()
        .filter(|(_, k)| *k == 'r')
        .map(|(t, _)| t.clone())
        .collect();
    (only_tables && functions.is_empty() && !tables.is_empty()).then_some(tables)
}

/// The columns of `tables` whose values the stream sends (the publication `$2` publishes them:
/// no generated column, none left out of a column list) and the stream and requests agree on
/// (Postgres's own integer and text types): see [`ColumnRow`].
pub(super) const COLUMNS: &str = "
SELECT quote_ident(a.attname), a.attname::text, t.typname IN ('int2', 'int4', 'int8'),
       a.atttypid, c.oid, n.nspname || '.' || c.relname,
       c.relreplident = 'f' OR EXISTS (
         SELECT 1 FROM pg_index i
          WHERE i.indrelid = c.oid AND a.attnum = ANY(i.indkey)
            AND ((c.relreplident = 'd' AND i.indisprimary)
              OR (c.relreplident = 'i' AND i.indisreplident)))
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
   AND a.attgenerated = ''
  JOIN pg_type t ON t.oid = a.atttypid AND t.typnamespace = 'pg_catalog'::regnamespace
  LEFT JOIN pg_collation co ON co.oid = a.attcollation
  JOIN pg_publication_tables p ON p.pubname = $2 AND p.schemaname = n.nspname
   AND p.tablename = c.relname AND a.attname = ANY(p.attnames)
 WHERE n.nspname || '.' || c.relname = ANY($1) AND c.relkind = 'r'
   AND t.typname IN ('int2', 'int4', 'int8', 'text')
   AND (a.attcollation = 0 OR co.collisdeterministic)";

/// One column of [`COLUMNS`].
pub(super) struct ColumnRow {
    /// The name as the plan prints it.
    pub printed: String,
    pub name: String,
    pub integer: bool,
    type_oid: u32,
    table_oid: u32,
    /// `schema.name`.
    pub table: String,
    /// In the replica identity.
    old_sent: bool,
}

pub(super) fn column_rows(rows: &[tokio_postgres::Row]) -> Vec<ColumnRow> {
    rows.iter()
        .map(|r| ColumnRow {
            printed: r.get(0),
            name: r.get(1),
            integer: r.get(2),
            type_oid: r.get(3),
            table_oid: r.get(4),
            table: r.get(5),
            old_sent: r.get(6),
        })
        .collect()
}

/// The planner's settings for the probe (`SET LOCAL`: gone with the caller's rollback).
pub(super) const PLANNER: &str =
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
                       SET LOCAL plan_cache_mode = force_generic_plan";

/// The probe's statements: one per message (extended protocol), so the caller's text cannot
/// end the transaction. Prepared statements outlive a rollback: deallocated after (and the
/// session is reset after the analysis anyway). VERBOSE: each scan names its table's schema,
/// and every column its table's alias.
fn probe(sql: &str, params: usize) -> (String, String) {
    let explain = match params {
        0 => "EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE ferry_value_probe".to_string(),
        _ => format!(
            "EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE ferry_value_probe({})",
            vec!["NULL"; params].join(", ")
        ),
    };
    (format!("PREPARE ferry_value_probe AS {sql}\n"), explain)
}
const DEALLOCATE: &str = "DEALLOCATE ferry_value_probe";

/// Asks the planner, inside the caller's transaction (rolled back after: the settings are
/// `SET LOCAL`), whether `sql` (with parameters of types `params`) reads each of `tables`
/// (`schema.name`, every table it reads) by one column's value, as the stream of
/// `publication` sends it. Any refusal is "no": the read then depends on its whole tables.
pub(crate) async fn by_value(
    client: &mut impl Ask,
    sql: &str,
    params: &[u32],
    tables: &[String],
    publication: &str,
) -> Option<Vec<ByValue>> {
    let columns = column_rows(&client.query(COLUMNS, &[&tables, &publication]).await.ok()?);
    client.batch(PLANNER).await.ok()?;
    let plan = explained(client, sql, params.len()).await?;
    judge(&columns, &plan, params, tables)
}

/// `EXPLAIN (VERBOSE, FORMAT JSON)` of the generic plan of `sql` (with `params` parameters)
/// under the planner settings in force, parsed.
pub(super) async fn explained(client: &mut impl Ask, sql: &str, params: usize) -> Option<Value> {
    let (prepare, explain) = probe(sql, params);
    client.execute(&prepare).await.ok()?;
    let plan = client.simple(&explain).await;
    let _ = client.batch(DEALLOCATE).await;
    let text = plan.ok()?.into_iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })?;
    serde_json::from_str(&text).ok()
}

/// What the plan (`EXPLAIN (VERBOSE, FORMAT JSON)` of the generic plan) says: each scan's read
/// by one column's value (sorted, each once), covering every one of `tables`; or None.
fn judge(
    columns: &[ColumnRow],
    plan: &Value,
    types: &[u32],
    tables: &[String],
) -> Option<Vec<ByValue>> {
    // `schema.name` joined is ambiguous (schema `a.b`, table `c`; schema `a`, table `b.c`).
    let mut oids: Vec<(&str, u32)> = columns
        .iter()
        .map(|c| (c.table.as_str(), c.table_oid))
        .collect();
    oids.sort_unstable();
    oids.dedup();
    if oids.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    let mut scans = Vec::new();
    let mut subplans = false;
    scans_of(&plan[0]["Plan"], &mut scans, &mut subplans);
    // A subquery's output is printed as `$n` too (an InitPlan's): no plan with one is trusted.
    if subplans || scans.is_empty() {
        return None;
    }
    let mut found = scans
        .into_iter()
        .map(|scan| scan_by_value(columns, scan, types))
        .collect::<Option<Vec<ByValue>>>()?;
    found.sort();
    found.dedup();
    // Every table Postgres's parse says the read reads is seen scanned by a value: a plan
    // node that reads a table without naming it (an extension's custom scan) leaves the read
    // depending on its tables. (A join the planner proved useless goes too: conservative.)
    let mut scanned: Vec<&str> = found.iter().map(|v| v.table.as_str()).collect();
    scanned.dedup();
    let mut wanted: Vec<&str> = tables.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    wanted.dedup();
    (scanned == wanted).then_some(found)
}

/// One scan of the plan, if it is an index scan whose whole condition is `column = $n`, of a
/// column of [`COLUMNS`] and a parameter of the column's own type.
fn scan_by_value(columns: &[ColumnRow], scan: &Value, types: &[u32]) -> Option<ByValue> {
    let by_index = matches!(
        scan["Node Type"].as_str(),
        Some("Index Scan" | "Index Only Scan")
    );
    if !by_index {
        return None;
    }
    let table = format!(
        "{}.{}",
        scan["Schema"].as_str()?,
        scan["Relation Name"].as_str()?
    );
    let alias = scan["Alias"].as_str()?;
    let (printed, n) = scan["Index Cond"]
        .as_str()?
        .strip_prefix('(')?
        .strip_suffix(')')?
        .split_once(" = $")?;
    let n: usize = n.parse().ok()?;
    // The alias as Postgres prints it: bare, or quoted when it must be.
    let quoted = format!("\"{}\"", alias.replace('"', "\"\""));
    let column = columns.iter().find(|c| {
        c.table == table
            && [alias, quoted.as_str()]
                .iter()
                .any(|a| printed == format!("{a}.{}", c.printed))
    })?;
    // The parameter of the column's own type: another (`$1::name`, which Postgres truncates
    // to 63 bytes) could find rows whose value is not the request's text.
    if types.get(n.wrapping_sub(1)) != Some(&column.type_oid) {
        return None;
    }
    (1..=types.len()).contains(&n).then(|| ByValue {
        table,
        column: column.name.clone(),
        param: n - 1,
        integer: column.integer,
        old_sent: column.old_sent,
    })
}

/// Every node of `plan` that scans a relation; and whether any is a subquery's plan.
pub(super) fn scans_of<'a>(plan: &'a Value, into: &mut Vec<&'a Value>, subplans: &mut bool) {
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

    fn column(table: &str, oid: u32, name: &str) -> ColumnRow {
        ColumnRow {
            printed: name.into(),
            name: name.into(),
            integer: true,
            type_oid: 23,
            table_oid: oid,
            table: table.into(),
            old_sent: name == "id",
        }
    }

    /// A generic plan of a join of authors `a` to posts `p`, each scanned as given.
    fn join_plan(authors: Value, posts: Value) -> Value {
        json!([{"Plan": {"Node Type": "Nested Loop", "Plans": [authors, posts]}}])
    }

    fn scan(alias: &str, table: &str, cond: &str) -> Value {
        json!({"Node Type": "Index Scan", "Schema": "public", "Relation Name": table,
               "Alias": alias, "Index Cond": cond})
    }

    #[test]
    fn a_join_is_by_value_only_when_every_table_is_scanned_by_one() {
        let columns = [
            column("public.authors", 1, "id"),
            column("public.posts", 2, "id"),
            column("public.posts", 2, "author_id"),
        ];
        let tables = ["public.authors".to_string(), "public.posts".to_string()];
        let both = join_plan(
            scan("a", "authors", "(a.id = $1)"),
            scan("p", "posts", "(p.author_id = $1)"),
        );
        let found = judge(&columns, &both, &[23], &tables).expect("by value");
        let named: Vec<(&str, &str)> = found
            .iter()
            .map(|v| (v.table.as_str(), v.column.as_str()))
            .collect();
        assert_eq!(
            named,
            [("public.authors", "id"), ("public.posts", "author_id")]
        );
        assert!(found[1].describe().contains("REPLICA IDENTITY FULL"));
        // The second table found through the first.
        let through = join_plan(
            scan("a", "authors", "(a.id = p.author_id)"),
            scan("p", "posts", "(p.id = $1)"),
        );
        assert_eq!(judge(&columns, &through, &[23], &tables), None);
        // A table read by a node that does not name it.
        let unnamed = join_plan(
            json!({"Node Type": "Custom Scan", "Custom Plan Provider": "x"}),
            scan("p", "posts", "(p.author_id = $1)"),
        );
        assert_eq!(judge(&columns, &unnamed, &[23], &tables), None);
        // Another alias's column of the same name; a parameter of another type.
        let other = join_plan(
            scan("a", "authors", "(p.id = $1)"),
            scan("p", "posts", "(p.author_id = $1)"),
        );
        assert_eq!(judge(&columns, &other, &[23], &tables), None);
        assert_eq!(judge(&columns, &both, &[25], &tables), None);
    }

    #[test]
    fn a_value_is_written_as_the_stream_writes_it_or_not_at_all() {
        let int = ByValue {
            table: "public.posts".into(),
            column: "id".into(),
            param: 0,
            integer: true,
            old_sent: true,
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

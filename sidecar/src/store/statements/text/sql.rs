//! The text pieces of the SQL-over-HTTP path: parameters as SQL literals that nothing in the
//! session can reinterpret, the command tag node-postgres reports, and the type sizes of
//! `fields`.

/// One parameter as an SQL literal: `NULL`, or an `E'...'` string that is plain ASCII whatever
/// the value holds. Backslashes and quotes are escaped, and every other byte outside printable
/// ASCII is written as a `\u`/`\U` escape, so the literal reads the same under any
/// `standard_conforming_strings` and any client encoding a statement of the same transaction
/// may have set (a multibyte encoding can swallow a quote that follows a lead byte; there are
/// no lead bytes here). An untyped literal takes the parameter type Postgres inferred, exactly
/// as a text parameter of the extended protocol does. None: the value holds a NUL character,
/// which Postgres text cannot hold.
pub(super) fn literal(value: Option<&str>) -> Option<String> {
    let Some(v) = value else {
        return Some("NULL".into());
    };
    let mut out = String::with_capacity(v.len() + 4);
    out.push_str("E'");
    for c in v.chars() {
        match c {
            '\0' => return None,
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push_str(&format!("\\U{:08X}", c as u32)),
        }
    }
    out.push('\'');
    Some(out)
}

/// The command tag name Neon reports as `command`: the first word of Postgres's tag (`SELECT`,
/// `INSERT`, `CREATE`, `TRUNCATE`...; Neon's proxy splits the tag at its first space). The
/// driver under Ferry reports only the row count of a command, so the name is read from the
/// statement's keywords outside parentheses, quotes and comments as Postgres would tag it:
/// `WITH ...` takes the verb its CTEs belong to, and `CREATE TABLE ... AS` / `CREATE
/// MATERIALIZED VIEW ... AS` are tagged `SELECT n` unless `WITH NO DATA`.
pub(super) fn command(sql: &str) -> String {
    let words = top_level_words(sql);
    let first = words.first().map(String::as_str).unwrap_or_default();
    if sql.trim_start().starts_with('(') {
        return "SELECT".into(); // (SELECT ...) UNION (SELECT ...)
    }
    match first {
        "SELECT" | "VALUES" | "TABLE" => "SELECT".into(),
        "WITH" => words
            .iter()
            .find_map(|w| match w.as_str() {
                "SELECT" | "VALUES" | "TABLE" => Some("SELECT".to_string()),
                "INSERT" | "UPDATE" | "DELETE" | "MERGE" => Some(w.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "SELECT".into()),
        "CREATE" if creates_from_query(&words) => "SELECT".into(),
        _ => first.to_string(),
    }
}

/// `CREATE [modifiers] TABLE|MATERIALIZED VIEW ... AS query`, filled with the query's rows.
fn creates_from_query(words: &[String]) -> bool {
    let object = words[1..].iter().find(|w| {
        !matches!(
            w.as_str(),
            "OR" | "REPLACE" | "GLOBAL" | "LOCAL" | "TEMP" | "TEMPORARY" | "UNLOGGED"
        )
    });
    let no_data = words.ends_with(&["WITH".into(), "NO".into(), "DATA".into()]);
    matches!(object.map(String::as_str), Some("TABLE" | "MATERIALIZED"))
        && words.iter().any(|w| w == "AS")
        && !no_data
}

/// The statement's words outside parentheses, quotes and comments, in upper case.
fn top_level_words(sql: &str) -> Vec<String> {
    let b = sql.as_bytes();
    let (mut i, mut depth) = (0usize, 0i32);
    let mut words = Vec::new();
    while i < b.len() {
        match b[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b'\'' | b'"' => {
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q {
                    i += 1;
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let rest = crate::store::statements::class::skip_block_comment(&sql[i..]);
                i = sql.len() - rest.len();
                continue;
            }
            b'$' => {
                // $tag$ ... $tag$ (a bare $1 parameter has no closing $).
                let tag_end = sql[i + 1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map(|n| i + 1 + n);
                if let Some(e) = tag_end.filter(|&e| b[e] == b'$') {
                    let tag = &sql[i..=e];
                    i = sql[e + 1..]
                        .find(tag)
                        .map_or(b.len(), |n| e + 1 + n + tag.len());
                    continue;
                }
            }
            c if c.is_ascii_alphabetic() && depth == 0 => {
                let end = sql[i..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map_or(b.len(), |n| i + n);
                words.push(sql[i..end].to_ascii_uppercase());
                i = end;
                continue;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                // the rest of an identifier that began with a non-letter: skip it whole
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    words
}

/// Whether a command tag carries a row count (node-postgres gives `rowCount: null` otherwise).
pub(super) fn counts_rows(command: &str) -> bool {
    matches!(
        command,
        "SELECT" | "INSERT" | "UPDATE" | "DELETE" | "MERGE" | "FETCH" | "MOVE" | "COPY"
    )
}

/// `pg_type.typlen` of the built-in types (`dataTypeSize` in `fields`); -1 (variable length)
/// for the rest, as node-postgres reports for text, arrays and records.
pub(super) fn type_size(oid: u32) -> i16 {
    match oid {
        16 | 18 => 1,                             // bool, "char"
        21 => 2,                                  // int2
        23 | 26 | 700 | 1082 | 28 => 4,           // int4, oid, float4, date, xid
        20 | 701 | 1083 | 1114 | 1184 | 790 => 8, // int8, float8, time, timestamp(tz), money
        1266 => 12,                               // timetz
        1186 | 2950 => 16,                        // interval, uuid
        19 => 64,                                 // name
        _ => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_ascii_and_closed() {
        assert_eq!(literal(None).as_deref(), Some("NULL"));
        assert_eq!(literal(Some("a'b")).as_deref(), Some("E'a''b'"));
        assert_eq!(literal(Some("\\'")).as_deref(), Some("E'\\\\'''"));
        assert_eq!(
            literal(Some("é😀\n")).as_deref(),
            Some("E'\\u00E9\\U0001F600\\u000A'")
        );
        assert_eq!(literal(Some("a\0b")), None);
    }

    #[test]
    fn commands_are_named_as_postgres_names_them() {
        for (sql, tag) in [
            ("select 1", "SELECT"),
            ("  (SELECT 1)", "SELECT"),
            ("(select 1) union (select 2)", "SELECT"),
            ("values (1)", "SELECT"),
            ("insert into t values (1)", "INSERT"),
            ("WITH a AS (SELECT 1) DELETE FROM t", "DELETE"),
            (
                "with x as (insert into t values (1) returning *) select * from x",
                "SELECT",
            ),
            (
                "WITH RECURSIVE r(n) AS (VALUES (1)) SELECT * FROM r",
                "SELECT",
            ),
            ("create table t (id int)", "CREATE"),
            (
                "create table t (a int generated always as (1) stored)",
                "CREATE",
            ),
            ("CREATE UNIQUE INDEX i ON t (id)", "CREATE"),
            (
                "create or replace function f() returns table (a int) as $$ select 1 $$ \
                 language sql",
                "CREATE",
            ),
            ("create materialized view v as select 1", "SELECT"),
            ("create temp table t as select 1", "SELECT"),
            ("create table t as select 1 with no data", "CREATE"),
            ("drop table t", "DROP"),
            ("truncate t", "TRUNCATE"),
            ("refresh materialized view v", "REFRESH"),
            ("begin", "BEGIN"),
            ("-- note\nupdate t set a = 1", "UPDATE"),
        ] {
            assert_eq!(command(sql), tag, "{sql}");
        }
    }
}

//! One statement run as a simple query on its description (prepared now, or remembered from
//! before: `store::postgres::described`), its result as node-postgres shapes it.

use super::errors::pg;
use super::sql::{command, counts_rows, literal, type_size};
use super::{Budget, Query, PREPARE};
use crate::error::ApiError;
use crate::store::pools::session::RESET;
use crate::store::postgres::described::{Description, Descriptions};
use crate::store::statements::behind::{sent_behind, Sent};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio_postgres::{Client, SimpleQueryMessage};

/// Where a statement's description is remembered (`store::postgres::described`): a run whose
/// columns are not those of the description it was given describes it again, and remembers
/// that.
pub(super) struct Memo<'a> {
    pub described: &'a Descriptions,
    pub role: Option<&'a Arc<str>>,
}

/// Runs one statement as a simple query on its description; its result as node-postgres
/// shapes it. `sent`: how a failure once it was sent reaches the caller; `then`: sent after it
/// in the same simple query (the COMMIT of its transaction), skipped by Postgres if it fails.
/// The rows are read by the columns the run itself reports; should they not be the
/// description's (one remembered from before a schema change), the statement is described
/// again once it has run (never run twice: it may have written) and the answer told by that.
pub(super) async fn statement(
    client: &Client,
    q: &Query,
    d: &Description,
    budget: &mut Budget,
    sent: fn(tokio_postgres::Error) -> ApiError,
    then: &str,
    memo: Option<Memo<'_>>,
) -> Result<Value, ApiError> {
    if d.params != q.params.len() {
        return Err(ApiError::BadParams {
            message: format!(
                "bind message supplies {} parameters, but prepared statement \"\" requires {}",
                q.params.len(),
                d.params
            ),
            pg_code: Some("08P01".into()),
        });
    }
    let (mut text, target) = if q.params.is_empty() {
        (q.sql.clone(), 0)
    } else {
        let literals = q
            .params
            .iter()
            .map(|p| literal(p.as_deref()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::BadParams {
                message: "invalid byte sequence for encoding \"UTF8\": 0x00".into(),
                pg_code: Some("22021".into()),
            })?;
        // The newlines end a trailing `--` comment of the caller's SQL.
        let text = format!(
            "{PREPARE}{}\n;EXECUTE ferry_sql({})\n;DEALLOCATE ferry_sql",
            q.sql,
            literals.join(", ")
        );
        (text, 1)
    };
    text.push_str(then);
    let mut names: Vec<String> = d.fields.iter().map(|f| f.name.clone()).collect();
    let mut described_names = true;
    let mut rows = Vec::new();
    let (mut completed, mut count) = (0usize, 0u64);
    let stream = client.simple_query_raw(&text).await.map_err(sent)?;
    let mut stream = std::pin::pin!(stream);
    while let Some(message) = stream.next().await {
        let message = match message {
            Ok(m) => m,
            Err(e) => return Err(located(sent(e), completed, target)),
        };
        match message {
            SimpleQueryMessage::RowDescription(columns)
                if !columns
                    .iter()
                    .map(|c| c.name())
                    .eq(names.iter().map(String::as_str)) =>
            {
                names = columns.iter().map(|c| c.name().to_string()).collect();
                described_names = false;
            }
            SimpleQueryMessage::Row(row) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                rows.push(budget.row(&row, &names, q.array_mode)?);
            }
            SimpleQueryMessage::CommandComplete(n) => {
                if completed == target {
                    count = n;
                }
                completed += 1;
            }
            _ => {}
        }
    }
    let fresh;
    let d = match (described_names, memo) {
        (true, _) | (false, None) => d,
        (false, Some(memo)) => {
            let generation = memo.described.generation();
            fresh = again(client, q, &names).await;
            if let Some(f) = &fresh {
                memo.described
                    .remember(memo.role, &q.sql, f.clone(), generation);
            }
            fresh.as_ref().unwrap_or(d)
        }
    };
    let command = command(&q.sql);
    let fields: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            // A column the description does not name the same (a schema changed twice
            // within moments): told as text, which every value is.
            let f = d.fields.get(i).filter(|f| &f.name == name);
            let type_oid = f.map_or(TEXT, |f| f.type_oid);
            json!({
                "name": name,
                "dataTypeID": type_oid,
                "tableID": f.map_or(0, |f| f.table_oid),
                "columnID": f.map_or(0, |f| f.column_id),
                "dataTypeSize": type_size(type_oid),
                "dataTypeModifier": f.map_or(-1, |f| f.type_modifier),
                "format": "text",
            })
        })
        .collect();
    Ok(json!({
        "command": command,
        "rowCount": if counts_rows(&command) { json!(count) } else { Value::Null },
        "rows": rows,
        "fields": fields,
        "rowAsArray": q.array_mode,
    }))
}

/// `text`'s type OID.
const TEXT: u32 = 25;

/// The statement described again after a run whose columns (`names`) were not those of its
/// description; None when it cannot be, or is not those columns either.
async fn again(client: &Client, q: &Query, names: &[String]) -> Option<Description> {
    let fresh = Description::of(&client.prepare(&q.sql).await.ok()?);
    fresh
        .fields
        .iter()
        .map(|f| &f.name)
        .eq(names.iter())
        .then_some(fresh)
}

/// [`statement`] of a single read met before, in its own read-only transaction: BEGIN, the
/// simple query (with its COMMIT) and the session's reset go in one write, one round trip.
/// Failures end as on the prepared path: rolled back, the reset sent again after it by the
/// caller.
pub(super) async fn described_read<'a>(
    client: &'a Client,
    q: &Query,
    d: &Description,
    budget: &mut Budget,
    memo: Memo<'_>,
) -> Result<(Value, Option<Sent<'a>>), ApiError> {
    let read = statement(client, q, d, budget, pg, "\n;COMMIT", Some(memo));
    let (begin, (out, sent)) = futures_util::future::join(
        client.batch_execute("BEGIN READ ONLY"),
        sent_behind(read, Box::pin(client.batch_execute(RESET))),
    )
    .await;
    let e = match (begin, out) {
        (Ok(()), Ok(v)) => return Ok((v, Some(sent))),
        (Err(e), _) => pg(e),
        (Ok(()), Err(e)) => e,
    };
    // A result cut short closes the session instead (its rows may still be coming).
    if !matches!(e, ApiError::ResultTooLarge { .. }) {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    Err(e)
}

/// An error position points into the simple query Ferry sent: moved back onto the caller's
/// SQL (the PREPARE prefix), or dropped when the error came from the parameter literals.
fn located(e: ApiError, completed: usize, target: usize) -> ApiError {
    let ApiError::Postgres(mut f) = e else {
        return e;
    };
    if target == 1 {
        f.position = match completed {
            0 => f
                .position
                .and_then(|p| p.parse::<usize>().ok())
                .and_then(|p| p.checked_sub(PREPARE.len()))
                .map(|p| p.to_string()),
            _ => None,
        };
    }
    ApiError::Postgres(f)
}

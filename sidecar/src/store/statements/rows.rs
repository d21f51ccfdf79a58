//! What both drivers do with a statement's values: parameters bound from JSON (`bind`),
//! result columns checked before a statement runs (`check_columns`), and rows decoded to JSON
//! within the read limits as they arrive (`RowBudget`, `read_rows`), for the pooled sessions
//! (`pooled`, `transaction`, `interactive`) and the event-loop ones (`on_loop`).

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::store::postgres::failure::Failure;
use crate::store::statements::json::{self, Raw};
use crate::store::statements::params::{self, TextParam};
use ferry_shared::api::Row;
use postgres::fallible_iterator::FallibleIterator;
use postgres::{RowIter, Statement};
use postgres_types::{ToSql, Type};
use serde_json::Value;

/// Refuses a statement whose result has a column type Ferry cannot put in JSON, before it runs.
pub(in crate::store) fn check_columns(stmt: &Statement) -> Result<(), Failure> {
    for col in stmt.columns() {
        json::check_supported(col.type_()).map_err(|type_name| {
            Failure::Api(ApiError::UnsupportedType {
                column: col.name().to_string(),
                type_name,
            })
        })?;
    }
    Ok(())
}

/// Decodes rows as they arrive (the driver reads the socket only as fast as they are taken),
/// so an oversized result is stopped before it is buffered: then the limit it passed is
/// returned beside the rows so far.
pub(in crate::store) fn read_rows(
    rows: &mut RowIter<'_>,
    limits: ReadLimits,
) -> Result<(Vec<Row>, Option<String>), Failure> {
    let mut budget = RowBudget::new(limits);
    while let Some(row) = rows.next()? {
        if let Some(limit) = budget.push(&row)? {
            return Ok((budget.rows, Some(limit)));
        }
    }
    Ok((budget.rows, None))
}

/// Rows decoded to JSON within the read limits, one at a time (both drivers' rows).
pub(in crate::store) struct RowBudget {
    pub rows: Vec<Row>,
    limits: ReadLimits,
    bytes: usize,
}

impl RowBudget {
    pub(crate) fn new(limits: ReadLimits) -> Self {
        RowBudget {
            rows: Vec::new(),
            limits,
            bytes: 0,
        }
    }

    /// Takes one more row; Some(the limit) when it would pass one (the row is not kept).
    pub(crate) fn push(&mut self, row: &postgres::Row) -> Result<Option<String>, Failure> {
        let limits = self.limits;
        if self.rows.len() >= limits.max_rows {
            return Ok(Some(format!(
                "limits.max_read_rows ({} rows)",
                limits.max_rows
            )));
        }
        let mut obj = Row::new();
        for (i, col) in row.columns().iter().enumerate() {
            let raw: Raw = row.try_get(i).map_err(Failure::from)?;
            self.bytes += col.name().len() + raw.0.map_or(4, <[u8]>::len) + 4;
            let value = json::to_json(col.type_(), raw.0).map_err(|e| {
                Failure::Api(match e {
                    json::DecodeError::Unsupported(type_name) => ApiError::UnsupportedType {
                        column: col.name().to_string(),
                        type_name,
                    },
                    other => ApiError::internal(format!("column {}: {other}", col.name())),
                })
            })?;
            obj.insert(col.name().to_string(), value);
        }
        if self.bytes > limits.max_bytes {
            return Ok(Some(format!(
                "limits.max_read_bytes ({} bytes)",
                limits.max_bytes
            )));
        }
        self.rows.push(obj);
        Ok(None)
    }
}

pub(in crate::store) fn bind(types: &[Type], params: &[Value]) -> Result<Vec<TextParam>, ApiError> {
    if types.len() != params.len() {
        return Err(ApiError::BadParams {
            message: format!(
                "the statement takes {} parameter(s), {} given",
                types.len(),
                params.len()
            ),
            pg_code: None,
        });
    }
    params
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (v, ty))| {
            params::to_text(v, ty).map_err(|m| ApiError::BadParams {
                message: format!("params[{i}] (${}, {}): {m}", i + 1, ty.name()),
                pg_code: None,
            })
        })
        .collect()
}

pub(in crate::store) fn refs(params: &[TextParam]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

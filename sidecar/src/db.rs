//! Running the caller's statements on Postgres (blocking; called inside `Blocking::run`).

use crate::error::ApiError;
use crate::pg_json::{self, Raw};
use crate::pg_params::{self, TextParam};
use crate::pools::Pools;
use ferry_shared::api::Row;
use postgres::error::SqlState;
use postgres::{Client, Statement};
use postgres_types::ToSql;
use serde_json::Value;

/// Runs a read and returns its rows as JSON objects.
///
/// A read is idempotent, so when the pooled connection turns out to be dead (Postgres restarted
/// since it was opened) it is retried once on a fresh one.
pub fn query(pools: &Pools, sql: &str, params: &[Value]) -> Result<Vec<Row>, ApiError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut conn = pools.pg_conn()?;
        match query_on(&mut conn, sql, params) {
            Err(Failure::Closed(e)) if attempts < 2 => {
                tracing::debug!(error = %e, "postgres connection was closed; retrying once");
                continue;
            }
            Err(f) => return Err(f.into_api()),
            Ok(rows) => return Ok(rows),
        }
    }
}

/// Runs a write and returns the number of rows it affected. Never retried: a dead connection
/// may have sent the statement, and only the caller knows if running it twice is safe.
pub fn execute(pools: &Pools, sql: &str, params: &[Value]) -> Result<u64, ApiError> {
    let mut conn = pools.pg_conn()?;
    let stmt = prepare(&mut conn, sql).map_err(Failure::into_api)?;
    let params = bind(&stmt, params)?;
    conn.execute(&stmt, &refs(&params))
        .map_err(|e| Failure::from(e).into_api())
}

/// Postgres ping for /readyz.
pub fn ping(pools: &Pools) -> Result<(), ApiError> {
    let mut conn = pools.pg_conn()?;
    conn.simple_query("SELECT 1")
        .map(|_| ())
        .map_err(|e| Failure::from(e).into_api())
}

fn query_on(conn: &mut Client, sql: &str, params: &[Value]) -> Result<Vec<Row>, Failure> {
    let stmt = prepare(conn, sql)?;
    for col in stmt.columns() {
        pg_json::check_supported(col.type_()).map_err(|type_name| {
            Failure::Api(ApiError::UnsupportedType {
                column: col.name().to_string(),
                type_name,
            })
        })?;
    }
    let params = bind(&stmt, params).map_err(Failure::Api)?;
    let rows = conn.query(&stmt, &refs(&params))?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut obj = Row::new();
        for (i, col) in row.columns().iter().enumerate() {
            let raw: Raw = row.try_get(i).map_err(Failure::from)?;
            let value = pg_json::to_json(col.type_(), raw.0).map_err(|e| {
                Failure::Api(match e {
                    pg_json::DecodeError::Unsupported(type_name) => ApiError::UnsupportedType {
                        column: col.name().to_string(),
                        type_name,
                    },
                    other => ApiError::internal(format!("column {}: {other}", col.name())),
                })
            })?;
            obj.insert(col.name().to_string(), value);
        }
        out.push(obj);
    }
    Ok(out)
}

fn prepare(conn: &mut Client, sql: &str) -> Result<Statement, Failure> {
    Ok(conn.prepare(sql)?)
}

fn bind(stmt: &Statement, params: &[Value]) -> Result<Vec<TextParam>, ApiError> {
    let types = stmt.params();
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
            pg_params::to_text(v, ty).map_err(|m| ApiError::BadParams {
                message: format!("params[{i}] (${}, {}): {m}", i + 1, ty.name()),
                pg_code: None,
            })
        })
        .collect()
}

fn refs(params: &[TextParam]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// A Postgres failure, split by whether a retry on a fresh connection makes sense.
enum Failure {
    Closed(postgres::Error),
    Pg(postgres::Error),
    Api(ApiError),
}

impl From<postgres::Error> for Failure {
    fn from(e: postgres::Error) -> Self {
        if e.is_closed() {
            Failure::Closed(e)
        } else {
            Failure::Pg(e)
        }
    }
}

impl Failure {
    fn into_api(self) -> ApiError {
        match self {
            Failure::Api(a) => a,
            Failure::Closed(e) => ApiError::DatabaseUnavailable {
                internal: e.to_string(),
            },
            Failure::Pg(e) => map_pg_error(e),
        }
    }
}

/// Postgres errors by SQLSTATE class: the caller's own mistakes are 400 with the code and
/// Postgres' message (about the caller's SQL); server trouble is 502/503/504 with no detail.
fn map_pg_error(e: postgres::Error) -> ApiError {
    let Some(db) = e.as_db_error() else {
        // Not from the server: I/O, protocol or conversion trouble on our side of the wire.
        return ApiError::DatabaseUnavailable {
            internal: e.to_string(),
        };
    };
    let code = db.code();
    let class = &code.code()[..2];
    if *code == SqlState::QUERY_CANCELED {
        return ApiError::Timeout {
            what: "postgres (statement_timeout)",
        };
    }
    match class {
        // connection exception, operator intervention (shutdown), insufficient resources
        "08" | "57" | "53" => ApiError::DatabaseUnavailable {
            internal: format!("{}: {}", code.code(), db.message()),
        },
        // system error, config file error, internal error: not the caller's to see
        "58" | "F0" | "XX" => ApiError::Upstream {
            internal: format!("{}: {}", code.code(), db.message()),
        },
        // Postgres could not read a parameter value: it says so in the error's context
        // ("unnamed portal parameter $1 = ...").
        _ if db.where_().is_some_and(|w| w.contains("portal parameter")) => ApiError::BadParams {
            message: db.message().to_string(),
            pg_code: Some(code.code().to_string()),
        },
        _ => ApiError::Sql {
            pg_code: code.code().to_string(),
            message: db.message().to_string(),
        },
    }
}

//! Statements run on one of this worker's Postgres sessions with Postgres's own text output
//! for every value (`/sql`, the Neon-compatible endpoint, and its cached reads).
//!
//! node-postgres parses each value from Postgres's text format, so the values must be exactly
//! what Postgres prints (timestamps in the session's DateStyle, floats, intervals, arrays,
//! custom types). The driver under Ferry asks for binary results on the extended protocol,
//! and only the simple-query protocol returns text. So each statement is first prepared on the
//! extended protocol (which refuses more than one statement, and describes the columns with
//! their types), then run as a simple query: as written when it has no parameters, else as
//! `PREPARE ferry_sql AS <sql>; EXECUTE ferry_sql(<literals>); DEALLOCATE ferry_sql`, each
//! parameter an untyped literal that Postgres reads with the inferred type exactly as it
//! reads a text parameter (see `text::literal` for why no value can escape its literal).
//! Rows are read as they arrive, within the read limits. Two round trips a statement, where
//! Neon's patched driver needs one; a single statement met before (not as an end user) runs as
//! the simple query alone, in one round trip (`store::postgres::described`). Behind a single
//! statement the session's reset goes in the same write, read or write alike.

mod errors;
mod sql;
mod statement;

use crate::config::ReadLimits;
use crate::error::ApiError;
use crate::store::pools::session::RESET;
use crate::store::pools::Pools;
use crate::store::postgres::described::Description;
use crate::store::statements::behind::{sent_behind, Sent};
use errors::{committing, pg};
use ferry_shared::api::Isolation;
use serde_json::{json, Map, Value};
use statement::{described_read, statement, Memo};
use tokio_postgres::Client;

/// One statement.
#[derive(Debug, Clone)]
pub(crate) struct Query {
    pub sql: String,
    /// Postgres text for each `$n`; None is NULL.
    pub params: Vec<Option<String>>,
    /// Rows as arrays (else objects by column name).
    pub array_mode: bool,
}

/// Statements to run: one, or a batch in one transaction.
#[derive(Debug, Clone)]
pub(crate) struct SqlPlan {
    pub queries: Vec<Query>,
    /// A batch answers `{"results": [...]}` and runs in one transaction.
    pub batch: bool,
    pub isolation: Option<Isolation>,
    pub read_only: bool,
    pub deferrable: bool,
    /// The Neon token's `postgres_url`, whose role's sessions run it (None: `postgres.url`).
    pub role: Option<std::sync::Arc<str>>,
    /// The end user it runs as (the driver's `authToken`), taken on before the first statement
    /// and dropped by the session's reset.
    pub identity: Option<std::sync::Arc<crate::store::postgres::identity::SessionIdentity>>,
}

/// The simple query's prefix before the caller's SQL, when it has parameters.
const PREPARE: &str = "PREPARE ferry_sql AS ";

/// Runs the plan on a session of this worker, then resets the session; a session whose result
/// was cut short or whose reset failed is closed instead.
pub(crate) async fn run(
    pools: &Pools,
    plan: &SqlPlan,
    limits: ReadLimits,
) -> Result<Value, ApiError> {
    let mut session = pools.pg_session_here(plan.role.as_deref()).await?;
    let Some(client) = session.client.as_ref() else {
        return Err(ApiError::internal("session without a client"));
    };
    let (out, sent) = match &plan.identity {
        Some(who) => match who.assume_async(client).await {
            Ok(()) => on_session(pools, client, plan, limits).await,
            Err(f) => (Err(f.into_api()), None),
        },
        None => on_session(pools, client, plan, limits).await,
    };
    // A result cut short, or a session found lost (its connection may still be open: the
    // driver's own statement gone, `failure::driver_statement_lost`), is closed instead.
    let closing = matches!(
        out,
        Err(ApiError::ResultTooLarge { .. } | ApiError::DatabaseUnavailable { .. })
    );
    // The reset sent behind a single read fails when the read did (its transaction was still
    // aborted when the reset ran): then it is sent again, after the rollback.
    let reset = !closing
        && !client.is_closed()
        && match sent {
            Some(sent) => sent.finish().await.is_ok() || client.batch_execute(RESET).await.is_ok(),
            None => client.batch_execute(RESET).await.is_ok(),
        };
    if reset {
        session.reusable = true;
    }
    out
}

/// Runs the plan; with the session's reset already sent behind a single read's statement.
async fn on_session<'a>(
    pools: &Pools,
    client: &'a Client,
    plan: &SqlPlan,
    limits: ReadLimits,
) -> (Result<Value, ApiError>, Option<Sent<'a>>) {
    match on_session_inner(pools, client, plan, limits).await {
        Ok((v, sent)) => (Ok(v), sent),
        Err(e) => (Err(e), None),
    }
}

async fn on_session_inner<'a>(
    pools: &Pools,
    client: &'a Client,
    plan: &SqlPlan,
    limits: ReadLimits,
) -> Result<(Value, Option<Sent<'a>>), ApiError> {
    let mut budget = Budget {
        limits,
        rows: 0,
        bytes: 0,
    };
    if !plan.batch {
        let q = &plan.queries[0];
        let role = plan.role.as_ref();
        let memo = || Memo {
            described: &pools.described,
            role,
        };
        // A statement met before (the same role and text: one statement, as its prepare found
        // then), not as an end user, runs on the columns Postgres described then: no prepare.
        let known = plan
            .identity
            .is_none()
            .then(|| pools.described.get(role, &q.sql))
            .flatten();
        // Only what the login role sees is kept: as an end user (`SET ROLE`), a name may find
        // another table (its search path, its schemas' privileges).
        let remember = |d: Description, generation: u64| {
            if plan.identity.is_none() {
                pools.described.remember(role, &q.sql, d, generation);
            }
        };
        if plan.read_only {
            if let Some(d) = known {
                return described_read(client, q, &d, &mut budget, memo()).await;
            }
            // In a transaction block of its own, as a batch is: outside one, a DO block could
            // COMMIT the read-only transaction it was given and write in the next. BEGIN goes
            // in the same write as the prepare, COMMIT in the statement's own round trip, and
            // the session's reset right behind it (no round trip of its own).
            let generation = pools.described.generation();
            let (begin, stmt) = futures_util::future::join(
                client.batch_execute("BEGIN READ ONLY"),
                client.prepare(&q.sql),
            )
            .await;
            begin.map_err(pg)?;
            let ran = match stmt.map(|s| Description::of(&s)) {
                Ok(d) => {
                    remember(d.clone(), generation);
                    let read = statement(client, q, &d, &mut budget, pg, "\n;COMMIT", None);
                    match sent_behind(read, Box::pin(client.batch_execute(RESET))).await {
                        (Ok(v), sent) => return Ok((v, Some(sent))),
                        // The reset ran inside the failed transaction: sent again after it.
                        (Err(e), _) => Err(e),
                    }
                }
                Err(e) => Err(pg(e)),
            };
            // A result cut short closes the session instead (its rows may still be coming).
            if matches!(&ran, Err(e) if !matches!(e, ApiError::ResultTooLarge { .. })) {
                let _ = client.batch_execute("ROLLBACK").await;
            }
            return ran.map(|v| (v, None));
        }
        // Sessions start read-only (a read cannot write); this one may write: sent in the
        // same write as the prepare, or as the statement met before; the reset turns it back.
        // A statement that may write is its own transaction: lost once sent, it may have
        // committed, and no outcome is kept for `/sql` (it is not signed). The session's
        // reset goes right behind it (no round trip of its own): the statement's implicit
        // transaction has ended, committed or not, by the time Postgres reads the reset.
        const WRITABLE: &str = "SET default_transaction_read_only = off";
        if let Some(d) = known {
            let run = statement(client, q, &d, &mut budget, committing, "", Some(memo()));
            let run = sent_behind(run, Box::pin(client.batch_execute(RESET)));
            let (_, (out, sent)) =
                futures_util::future::join(client.batch_execute(WRITABLE), run).await;
            return out.map(|v| (v, Some(sent)));
        }
        let generation = pools.described.generation();
        let (set, stmt) =
            futures_util::future::join(client.batch_execute(WRITABLE), client.prepare(&q.sql))
                .await;
        set.map_err(pg)?;
        let d = Description::of(&stmt.map_err(pg)?);
        remember(d.clone(), generation);
        let run = statement(client, q, &d, &mut budget, committing, "", None);
        let (out, sent) = sent_behind(run, Box::pin(client.batch_execute(RESET))).await;
        return out.map(|v| (v, Some(sent)));
    }
    client.batch_execute(&begin(plan)).await.map_err(pg)?;
    let mut results = Vec::with_capacity(plan.queries.len());
    for q in &plan.queries {
        let ran = match client.prepare(&q.sql).await {
            Ok(stmt) => {
                let d = Description::of(&stmt);
                statement(client, q, &d, &mut budget, pg, "", None).await
            }
            Err(e) => Err(pg(e)),
        };
        match ran {
            Ok(v) => results.push(v),
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(e);
            }
        }
    }
    if let Err(e) = client.batch_execute("COMMIT").await {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(committing(e));
    }
    Ok((json!({ "results": results }), None))
}

/// The statement that opens a batch's transaction (options are enums: nothing from the
/// caller is spliced in). Without an isolation header, the server's default applies.
fn begin(plan: &SqlPlan) -> String {
    let mut s = String::from("BEGIN");
    if let Some(i) = plan.isolation {
        s.push_str(match i {
            Isolation::ReadCommitted => " ISOLATION LEVEL READ COMMITTED,",
            Isolation::ReadUncommitted => " ISOLATION LEVEL READ UNCOMMITTED,",
            Isolation::RepeatableRead => " ISOLATION LEVEL REPEATABLE READ,",
            Isolation::Serializable => " ISOLATION LEVEL SERIALIZABLE,",
        });
    }
    s.push_str(if plan.read_only {
        " READ ONLY"
    } else {
        " READ WRITE"
    });
    if plan.deferrable {
        s.push_str(", DEFERRABLE");
    }
    s
}

/// The read limits over all of a request's rows.
struct Budget {
    limits: ReadLimits,
    rows: usize,
    bytes: usize,
}

impl Budget {
    fn row(
        &mut self,
        row: &tokio_postgres::SimpleQueryRow,
        names: &[&str],
        array_mode: bool,
    ) -> Result<Value, ApiError> {
        self.rows += 1;
        if self.rows > self.limits.max_rows {
            return Err(too_large(format!(
                "limits.max_read_rows ({} rows)",
                self.limits.max_rows
            )));
        }
        let mut out_array = Vec::new();
        let mut out_object = Map::new();
        for i in 0..row.len() {
            // Not UTF-8 only when the caller changed client_encoding (set_config): refused,
            // never a panic of the worker.
            let v = row.try_get(i).map_err(|_| ApiError::BadRequest {
                message: "a value is not UTF-8 (client_encoding must stay UTF8)".into(),
                field: None,
            })?;
            let name = names.get(i).copied().unwrap_or("?column?");
            self.bytes += name.len() + v.map_or(4, str::len) + 4;
            let v = v.map_or(Value::Null, |s| Value::String(s.to_string()));
            if array_mode {
                out_array.push(v);
            } else {
                out_object.insert(name.to_string(), v);
            }
        }
        if self.bytes > self.limits.max_bytes {
            return Err(too_large(format!(
                "limits.max_read_bytes ({} bytes)",
                self.limits.max_bytes
            )));
        }
        Ok(if array_mode {
            Value::Array(out_array)
        } else {
            Value::Object(out_object)
        })
    }
}

fn too_large(limit: String) -> ApiError {
    ApiError::ResultTooLarge { limit }
}

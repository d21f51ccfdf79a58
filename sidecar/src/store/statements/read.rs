//! A plain read's statement, written once for both kinds of session: a worker's own, on its
//! event loop (`on_loop`), and a pooled one, in the blocking pool (`pooled`). Each driver gives
//! the [`Steps`] (on a blocking session every step answers at once, and `ask::blocking` drives
//! the read to its end); the rules are here:
//! - as the end user, when there is one (their role and claims, `postgres::identity`);
//! - with the parameter types Postgres gave the first time (`param_types`), one round trip;
//!   a remembered type gone stale (a 22/42 error, which ran nothing) sends the statement the
//!   slow way, on a reset session, as the end user again (the reset put the login role back);
//! - else prepared (its columns checked before it runs, its types remembered), then run;
//! - a `skip_reset` read ([`kept`]) as a statement kept prepared on its session: Bind and
//!   Execute only, once it is there; one Postgres refuses as prepared (after a schema change)
//!   is prepared again on a reset session, once.

use crate::config::ReadLimits;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::identity::SessionIdentity;
use crate::store::postgres::loop_session::Prepared;
use crate::store::postgres::param_types::{self, ParamTypes};
use crate::store::statements::params::TextParam;
use crate::store::statements::rows::{bind, check_columns};
use ferry_shared::api::Row;
use postgres_types::{ToSql, Type};
use serde_json::Value;
use tokio_postgres::Statement;

/// A read's rows, and the limit that cut them short (the rest still on its way).
pub(in crate::store) type Taken = (Vec<Row>, Option<String>);

/// The steps a read takes on a session; rows are decoded within `limits` as they arrive
/// (`rows::RowBudget`).
pub(in crate::store) trait Steps {
    /// The statement, its parameters sent as `types`: unnamed Parse, Bind and Execute in one
    /// round trip.
    async fn typed(
        &mut self,
        sql: &str,
        params: &[TextParam],
        types: &[Type],
        limits: ReadLimits,
    ) -> Result<Taken, Failure>;
    async fn prepare(&mut self, sql: &str) -> Result<Statement, Failure>;
    async fn run(
        &mut self,
        stmt: &Statement,
        params: &[TextParam],
        limits: ReadLimits,
    ) -> Result<Taken, Failure>;
    /// Puts the session back as a fresh one (`session::RESET`), before a retry: what a failed
    /// attempt left on it goes first.
    async fn reset(&mut self) -> Result<(), Failure>;
    /// Takes on an end user's role and claims for the rest of the session's request.
    async fn assume(&mut self, who: &SessionIdentity) -> Result<(), Failure>;
}

/// Parameters bound as remembered `types`, as the drivers' `query_typed_raw` takes them.
pub(in crate::store) fn typed<'a>(
    params: &'a [TextParam],
    types: &'a [Type],
) -> impl ExactSizeIterator<Item = (&'a (dyn ToSql + Sync), Type)> + 'a {
    params
        .iter()
        .zip(types)
        .map(|(p, ty)| (p as &(dyn ToSql + Sync), ty.clone()))
}

/// A read (see the module).
pub(in crate::store) async fn read(
    s: &mut impl Steps,
    types: &ParamTypes,
    (sql, params): (&str, &[Value]),
    limits: ReadLimits,
    who: Option<&SessionIdentity>,
) -> Result<Taken, Failure> {
    if let Some(who) = who {
        s.assume(who).await?;
    }
    if let Some(known) = types.get(sql) {
        // A value that does not fit a remembered type may fit the current one.
        if let Ok(bound) = bind(&known, params) {
            match s.typed(sql, &bound, &known, limits).await {
                Err(Failure::Pg(e)) if param_types::maybe_stale(&e) => {
                    s.reset().await?;
                    if let Some(who) = who {
                        s.assume(who).await?;
                    }
                }
                other => return other,
            }
        }
        types.forget(sql);
    }
    let stmt = s.prepare(sql).await?;
    check_columns(&stmt)?;
    let bound = bind(stmt.params(), params).map_err(Failure::Api)?;
    types.remember(sql, stmt.params());
    s.run(&stmt, &bound, limits).await
}

/// A `skip_reset` read (no reset follows a successful run) as a statement kept prepared on
/// the session (`prepared`). The caller resets after a failed run.
pub(in crate::store) async fn kept(
    s: &mut impl Steps,
    prepared: &mut Prepared,
    sql: &str,
    params: &[Value],
    limits: ReadLimits,
) -> Result<Taken, Failure> {
    if let Some(stmt) = prepared.get(sql).cloned() {
        let bound = bind(stmt.params(), params).map_err(Failure::Api)?;
        match s.run(&stmt, &bound, limits).await {
            // A failed run all the same: what it left on the session goes first (and with it
            // every statement prepared there).
            Err(Failure::Pg(e)) if param_types::stale_prepared(&e) => {
                prepared.clear();
                s.reset().await?;
            }
            other => return other,
        }
    }
    let stmt = s.prepare(sql).await?;
    check_columns(&stmt)?;
    let bound = bind(stmt.params(), params).map_err(Failure::Api)?;
    let out = s.run(&stmt, &bound, limits).await;
    if out.is_ok() {
        prepared.insert(sql.into(), stmt);
    }
    out
}

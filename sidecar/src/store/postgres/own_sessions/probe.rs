//! The probe itself (see the module's doc): the settings asked for at connect, then the
//! backend test, on two sessions (its own fresh connections at startup, two of the pool's
//! later: `again`), and the roles' audit.

use super::Problem;
use std::time::Duration;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long one session may wait for its answer while the other holds a transaction open:
/// Postgres answers these at once; a pooler with no free backend makes it wait.
pub(super) const WAIT: Duration = Duration::from_secs(3);

/// Rounds of the backend test (see the module's doc): a pooler may put a session back on its
/// backend by chance a few times, not eight times running.
const ROUNDS: usize = 8;

pub(super) async fn probe(
    config: &Config,
    tls: MakeRustlsConnect,
    wants_statement_timeout: bool,
    audit: Option<&crate::store::postgres::roles::Audit>,
) -> Result<(), Problem> {
    let mut a = connect(config, &tls).await?;
    let mut b = connect(config, &tls).await?;
    probe_sessions(&mut a, &mut b, wants_statement_timeout).await?;
    use crate::store::postgres::roles::{self, Refusal};
    if audit.is_some() {
        // The audit names catalogs and functions unqualified: on this session of the probe's
        // own, a search_path the audited role set for itself cannot put its objects first.
        a.batch_execute("SET search_path = pg_catalog, pg_temp")
            .await
            .map_err(problem)?;
    }
    match audit {
        // A query that got no answer judged nothing: asked again (a refusal is for good).
        Some(audit) => roles::audit(&a, audit).await.map_err(|r| match r {
            Refusal::NotAsked(e) => problem(e),
            Refusal::Unsafe(why) => Problem::Unsafe(why),
        }),
        None => Ok(()),
    }
}

/// Two sessions the probe asks: its own fresh connections at startup, two of the pool's later
/// (`again`).
pub(super) trait Session {
    /// The backend's pid and the probe's setting as this session sees them; with `set`, the
    /// setting is given first (for the session, not the transaction). Unanswered after
    /// `WAIT`: `Ok(None)`.
    async fn ask(&mut self, set: Option<&str>) -> Result<Option<(i32, Option<String>)>, Problem>;
    /// A statement whose answer is only "done".
    async fn exec(&mut self, sql: &str) -> Result<(), Problem>;
    /// The three settings of [`SETTINGS_SQL`].
    async fn settings(&mut self) -> Result<[String; 3], Problem>;
}

/// The settings, then the backend test (see the module's doc), on sessions `a` and `b`.
pub(super) async fn probe_sessions<S: Session>(
    a: &mut S,
    b: &mut S,
    wants_statement_timeout: bool,
) -> Result<(), Problem> {
    let [read_only, idle, statement] = a.settings().await?;
    judge_settings(&read_only, &idle, &statement, wants_statement_timeout)?;
    let no_answer = || Problem::Unreachable("no answer within 3 s".into());
    let not_own = |what: &str| {
        Err(Problem::NotOwn(format!(
            "{what} (a transaction-mode pooler, or one with fewer backends than sessions)"
        )))
    };
    // Each session marks its own backend; a direct connection keeps both for its life.
    let token = |who: &str| format!("{who}-{:016x}", rand::random::<u64>());
    let (a_token, b_token) = (token("a"), token("b"));
    let a_own = a.ask(Some(&a_token)).await?.ok_or_else(no_answer)?.0;
    let b_own = b.ask(Some(&b_token)).await?.ok_or_else(no_answer)?.0;
    if a_own == b_own {
        return not_own("two sessions shared one backend");
    }
    let moved = |seen: &(i32, Option<String>), pid: i32, token: &str| {
        seen.0 != pid || seen.1.as_deref() != Some(token)
    };
    for _ in 0..ROUNDS {
        // B holds a transaction open: its backend is taken for as long as it lasts. Named
        // apart in pg_stat_activity meanwhile: Ferry's own probe, not a request's transaction.
        b.exec(PROBE_BEGIN).await?;
        let in_tx = b.ask(None).await?.ok_or_else(no_answer)?;
        let during = a.ask(None).await;
        let _ = b.exec("ROLLBACK").await;
        let Some(during) = during? else {
            return not_own("a session waited for another session's transaction to end");
        };
        let after = a.ask(None).await?.ok_or_else(no_answer)?;
        if moved(&in_tx, b_own, &b_token)
            || moved(&during, a_own, &a_token)
            || moved(&after, a_own, &a_token)
        {
            return not_own("a session's statements ran on another backend than its own");
        }
    }
    Ok(())
}

/// The probe's transaction, as `pg_stat_activity` shows it while it lasts (at most `WAIT`).
pub(super) const PROBE_BEGIN: &str =
    "BEGIN; SET LOCAL application_name = 'ferry-own-session-probe'";

/// The probe's statements: it marks a session with one, and reads the mark back with the other.
pub(super) const MARK_SQL: &str =
    "SELECT pg_backend_pid(), set_config('ferry.own_session', $1, false)";
pub(super) const READ_MARK_SQL: &str =
    "SELECT pg_backend_pid(), current_setting('ferry.own_session', true)";

impl Session for Client {
    async fn ask(&mut self, set: Option<&str>) -> Result<Option<(i32, Option<String>)>, Problem> {
        let row = match set {
            Some(token) => tokio::time::timeout(WAIT, self.query_one(MARK_SQL, &[&token])).await,
            None => tokio::time::timeout(WAIT, self.query_one(READ_MARK_SQL, &[])).await,
        };
        let Ok(row) = row else {
            return Ok(None);
        };
        marked(&row.map_err(problem)?).map(Some)
    }

    async fn exec(&mut self, sql: &str) -> Result<(), Problem> {
        self.batch_execute(sql).await.map_err(problem)
    }

    async fn settings(&mut self) -> Result<[String; 3], Problem> {
        let row = self.query_one(SETTINGS_SQL, &[]).await.map_err(problem)?;
        Ok([0, 1, 2].map(|i| row.try_get::<_, String>(i).unwrap_or_default()))
    }
}

async fn connect(config: &Config, tls: &MakeRustlsConnect) -> Result<Client, Problem> {
    let timeout = config.get_connect_timeout().copied().unwrap_or(WAIT);
    let (client, connection) = tokio::time::timeout(timeout, config.connect(tls.clone()))
        .await
        .map_err(|_| Problem::Unreachable("connect timeout".into()))?
        .map_err(|e| match e.as_db_error() {
            // Postgres takes `options`; PgBouncer refuses it unless told to drop it.
            Some(db) if db.message().contains("unsupported startup parameter") => {
                Problem::NotOwn(format!(
                    "a pooler in between refused the session settings Ferry asks for at \
                     connect ({})",
                    db.message()
                ))
            }
            _ => problem(e),
        })?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The backend's pid and the probe's mark, from an answer to [`MARK_SQL`] or [`READ_MARK_SQL`].
pub(super) fn marked(row: &tokio_postgres::Row) -> Result<(i32, Option<String>), Problem> {
    let pid = row.try_get(0).map_err(problem)?;
    let seen: Option<String> = row.try_get(1).map_err(problem)?;
    Ok((pid, seen.filter(|s| !s.is_empty())))
}

/// A failed probe statement's verdict. The probe's statements are prepared, then run, in two
/// exchanges (tokio-postgres), under names each connection numbers from `s0`. On a session of
/// its own neither can go wrong; behind a transaction-mode pooler each exchange may land on
/// another backend: the run finds its statement missing there (26000), or the Parse finds the
/// name taken by another client's statement (42P05). Either is the pooler's doing, not an
/// unreachable Postgres: taken for one, the probe was asked again every 200 ms, and each run
/// was one more chance for the pooler's interleaving to pass it (it did once, in CI).
/// Anything else: asked again.
pub(super) fn problem(e: tokio_postgres::Error) -> Problem {
    use tokio_postgres::error::SqlState;
    let shared = [
        SqlState::INVALID_SQL_STATEMENT_NAME,
        SqlState::DUPLICATE_PSTATEMENT,
    ];
    if e.code().is_some_and(|c| shared.contains(c)) {
        return Problem::NotOwn(format!(
            "the probe's prepared statements were not those of its own session ({}): its \
             statements ran on more than one backend (a transaction-mode pooler)",
            crate::store::postgres::failure::describe(&e)
        ));
    }
    Problem::Unreachable(crate::store::postgres::failure::describe(&e))
}

/// The query that reads the settings Ferry asks for at connect, judged by [`judge_settings`].
pub(super) const SETTINGS_SQL: &str = "SELECT current_setting('default_transaction_read_only'), \
                                   current_setting('idle_in_transaction_session_timeout'), \
                                   current_setting('statement_timeout')";

/// Whether the settings read by [`SETTINGS_SQL`] are those Ferry asked for.
fn judge_settings(
    read_only: &str,
    idle: &str,
    statement: &str,
    wants_statement_timeout: bool,
) -> Result<(), Problem> {
    let mut missing = Vec::new();
    if read_only != "on" {
        missing.push("default_transaction_read_only = on");
    }
    if idle == "0" {
        missing.push("idle_in_transaction_session_timeout (any but 0)");
    }
    if wants_statement_timeout && statement == "0" {
        missing.push("statement_timeout (postgres.statement_timeout_ms)");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(Problem::NotOwn(format!(
        "the session settings Ferry asks for at connect are not in force ({}): something \
         between Ferry and Postgres dropped the `options` startup parameter (PgBouncer's \
         ignore_startup_parameters). Without a pooler they arrive; behind a session-mode one, \
         give them to the role (ALTER ROLE <role> SET ...)",
        missing.join(", ")
    )))
}

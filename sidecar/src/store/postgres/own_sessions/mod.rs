//! Ferry's Postgres sessions must be its own. Ferry is a pooler: it keeps each session for one
//! request at a time and relies on that for an end user's role and claims (set on the session,
//! see `identity`), for the reset after each request, for `skip_reset` statements kept prepared,
//! and for the settings it asks for at connect (reads are read-only by default, a session left in
//! a transaction is ended). Behind a transaction-mode pooler (PgBouncer, Supavisor, a hosted
//! plan's "pooled" URL) one request's statements land on other clients' sessions: measured with
//! PgBouncer 1.18, about half of the reads of four concurrent callers ran as another caller's
//! role or claims (`tests/pooler_between.rs`). So nothing is served from Postgres until a probe
//! has found the sessions to be Ferry's own:
//!
//! - the settings asked for at connect are in force (a pooler drops the `options` startup
//!   parameter: PgBouncer's `ignore_startup_parameters`);
//! - a session keeps its backend and its session state while another session holds a
//!   transaction open, and that other session gets neither (a transaction-mode pooler hands the
//!   backend just released to the next transaction, or makes one session wait for another's).
//!
//! A session-mode pooler passes once the settings are given to the role (`ALTER ROLE ... SET`).
//!
//! A verdict holds for the sessions the probe saw. New connections may lead somewhere else (a
//! failover to another address, a pooler put in between, a DNS name moved), so whenever the
//! pools have opened connections since the last passing probe, the readiness thread probes
//! again, on two of the pool's own sessions (`again`), while serving goes on; a refusal then is
//! for good too.

mod again;

use crate::error::ApiError;
use crate::store::postgres::{pg_async_config, pg_tls};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Why the sessions were not found to be Ferry's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Postgres could not be asked (down, or unreachable): asked again later.
    Unreachable(String),
    /// Something between Ferry and Postgres shares or changes its sessions: refused for good.
    NotOwn(String),
    /// The roles are not kept apart (`store::postgres::roles`): refused for good.
    Unsafe(String),
}

impl Problem {
    /// Refused for good (as opposed to not asked yet).
    pub(crate) fn is_final(&self) -> bool {
        !matches!(self, Problem::Unreachable(_))
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Unreachable(e) => write!(f, "postgres was not reachable: {e}"),
            Problem::NotOwn(why) => write!(
                f,
                "postgres.url does not give Ferry sessions of its own: {why}. Ferry pools \
                 connections itself: point postgres.url at Postgres directly (a hosted plan's \
                 direct or session-mode address, not its transaction-mode pooler)"
            ),
            Problem::Unsafe(why) => write!(
                f,
                "the Postgres roles are not kept apart: {why} (RELIABILITY.md, \"Who can do \
                 what\"; or postgres.single_role = true, unsafe)"
            ),
        }
    }
}

const UNCHECKED: u8 = 0;
const OWN: u8 = 1;
const NOT_OWN: u8 = 2;

/// The probe's verdict, shared by every checkout (one atomic load each).
pub(crate) struct OwnSessions {
    config: Config,
    tls: MakeRustlsConnect,
    /// `postgres.statement_timeout_ms` > 0: the session must have a statement timeout.
    wants_statement_timeout: bool,
    verdict: AtomicU8,
    why: Mutex<String>,
    /// Connections the pools have opened (each counts its own: `PgManager`, `AsyncPg`).
    opened: Arc<AtomicU64>,
    /// `opened` as it was when the last passing probe began.
    probed_through: AtomicU64,
    /// When the last probe again began (`again`).
    rechecked: Mutex<Option<Instant>>,
    /// The roles to check at the first probe (the primary only; `store::postgres::roles`).
    audit: Option<crate::store::postgres::roles::Audit>,
    /// The refusal was the roles' (`Problem::Unsafe`), not the sessions'.
    unsafe_roles: std::sync::atomic::AtomicBool,
}

impl OwnSessions {
    /// For `postgres.url` of `config` (a replica's config carries the replica's URL there).
    pub(crate) fn for_config(config: &crate::config::Config) -> Result<Self, ApiError> {
        let p = &config.postgres;
        Ok(OwnSessions {
            config: pg_async_config(config)?,
            tls: pg_tls(p).map_err(ApiError::internal)?,
            wants_statement_timeout: p.statement_timeout_ms > 0,
            verdict: AtomicU8::new(UNCHECKED),
            why: Mutex::new("the sessions were not checked yet".into()),
            opened: Arc::default(),
            probed_through: AtomicU64::new(0),
            rechecked: Mutex::new(None),
            audit: None,
            unsafe_roles: Default::default(),
        })
    }

    /// The roles are audited too, at the first probe (`store::postgres::roles`).
    pub(crate) fn with_audit(
        mut self,
        audit: Option<crate::store::postgres::roles::Audit>,
    ) -> Self {
        self.audit = audit;
        self
    }

    /// The counter the pools add each connection they open to.
    pub(crate) fn opened(&self) -> Arc<AtomicU64> {
        self.opened.clone()
    }

    /// Ok once the probe found the sessions to be Ferry's own; else why not (for the log).
    pub(crate) fn allowed(&self) -> Result<(), String> {
        if self.verdict.load(Ordering::Acquire) == OWN {
            return Ok(());
        }
        Err(self.why.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// No verdict yet (Postgres could not be asked so far): the caller asks again soon.
    pub(crate) fn unchecked(&self) -> bool {
        self.verdict.load(Ordering::Acquire) == UNCHECKED
    }

    /// Every Postgres checkout asks first: until the sessions were found to be Ferry's own,
    /// Postgres is unavailable (503 `database_unavailable`).
    pub(crate) fn gate(&self) -> Result<(), ApiError> {
        self.allowed()
            .map_err(|internal| ApiError::DatabaseUnavailable { internal })
    }

    /// Runs the probe unless a verdict is in (blocking: on a thread of its own, so that it may
    /// be called from inside a runtime). A refusal is for good; an unreachable Postgres is
    /// asked again on the next call.
    pub(crate) fn check(&self) -> Result<(), Problem> {
        match self.verdict.load(Ordering::Acquire) {
            OWN => return Ok(()),
            NOT_OWN => {
                let why = self.allowed().err().unwrap_or_default();
                return Err(if self.unsafe_roles.load(Ordering::Acquire) {
                    Problem::Unsafe(why)
                } else {
                    Problem::NotOwn(why)
                });
            }
            _ => {}
        }
        let opened = self.opened.load(Ordering::Acquire);
        self.settle(self.run_probe(), opened)
    }

    /// The probe, on a thread of its own (so that it may be called from inside a runtime).
    fn run_probe(&self) -> Result<(), Problem> {
        let (config, tls, wants_statement_timeout, audit) = (
            self.config.clone(),
            self.tls.clone(),
            self.wants_statement_timeout,
            self.audit.clone(),
        );
        std::thread::scope(|s| {
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Problem::Unreachable(e.to_string()))?;
                rt.block_on(probe(&config, tls, wants_statement_timeout, audit.as_ref()))
            })
            .join()
            .unwrap_or_else(|_| Err(Problem::Unreachable("the probe panicked".into())))
        })
    }

    /// Records a probe's verdict (`opened`: the connections opened when it began).
    fn settle(&self, out: Result<(), Problem>, opened: u64) -> Result<(), Problem> {
        let mut why = self.why.lock().unwrap_or_else(|p| p.into_inner());
        match &out {
            Ok(()) => {
                self.probed_through.store(opened, Ordering::Release);
                self.verdict.store(OWN, Ordering::Release);
            }
            Err(e @ (Problem::NotOwn(w) | Problem::Unsafe(w))) => {
                *why = w.clone();
                self.unsafe_roles
                    .store(matches!(e, Problem::Unsafe(_)), Ordering::Release);
                self.verdict.store(NOT_OWN, Ordering::Release);
                tracing::error!("{e}");
            }
            Err(Problem::Unreachable(e)) => {
                if self.verdict.load(Ordering::Acquire) != OWN {
                    *why = format!("not checked yet: {e}");
                }
            }
        }
        out
    }
}

/// How long one session may wait for its answer while the other holds a transaction open:
/// Postgres answers these at once; a pooler with no free backend makes it wait.
const WAIT: Duration = Duration::from_secs(3);

/// Rounds of the backend test (see the module's doc): a pooler may put a session back on its
/// backend by chance a few times, not eight times running.
const ROUNDS: usize = 8;

async fn probe(
    config: &Config,
    tls: MakeRustlsConnect,
    wants_statement_timeout: bool,
    audit: Option<&crate::store::postgres::roles::Audit>,
) -> Result<(), Problem> {
    let mut a = connect(config, &tls).await?;
    let mut b = connect(config, &tls).await?;
    probe_sessions(&mut a, &mut b, wants_statement_timeout).await?;
    match audit {
        Some(audit) => crate::store::postgres::roles::audit(&a, audit)
            .await
            .map_err(Problem::Unsafe),
        None => Ok(()),
    }
}

/// Two sessions the probe asks: its own fresh connections at startup, two of the pool's later
/// (`again`).
trait Session {
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
async fn probe_sessions<S: Session>(
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
        // B holds a transaction open: its backend is taken for as long as it lasts.
        b.exec("BEGIN").await?;
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

/// The probe's statements: it marks a session with one, and reads the mark back with the other.
const MARK_SQL: &str = "SELECT pg_backend_pid(), set_config('ferry.own_session', $1, false)";
const READ_MARK_SQL: &str = "SELECT pg_backend_pid(), current_setting('ferry.own_session', true)";

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
fn marked(row: &tokio_postgres::Row) -> Result<(i32, Option<String>), Problem> {
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
fn problem(e: tokio_postgres::Error) -> Problem {
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
const SETTINGS_SQL: &str = "SELECT current_setting('default_transaction_read_only'), \
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

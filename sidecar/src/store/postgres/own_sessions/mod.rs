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
mod probe;

use crate::error::ApiError;
use crate::store::postgres::{pg_async_config, pg_tls};
use probe::probe;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_postgres::Config;
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

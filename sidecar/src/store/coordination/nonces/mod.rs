//! Replay protection across sidecars (`auth.replay = "shared"`, the default). Every sidecar
//! first checks its own memory (`http::replay`), which alone is enough for one sidecar. Behind
//! a load balancer a captured request could be replayed to another one, so each nonce is also
//! recorded where every sidecar looks:
//!
//! - in Redis, for every signed request: its 16-byte fingerprint set in one hash per signed
//!   second to a token of the request's own unless another request set it first (`HSETNX`,
//!   then `HGET`: another's token = seen before), the hash expiring once that second leaves the
//!   clock window (`EXPIREAT`, in the same round trip). The token lets the check go again on a
//!   connection Redis ended (`store::pools::send`): finding its own token is still a first
//!   sighting. One hash per second rather than one key per nonce: Redis then neither creates
//!   nor expires a key per request. Measured (bench `scale`): a signed cache GET cost Redis
//!   3.4x the CPU of the GET alone with a key per nonce, 1.5x with sets (the hash costs
//!   Redis 1.8 µs a check where the set's `SADD` cost 1.1, `redis-cli --pipe`). A read's check
//!   rides in front of the read's own pipeline ([`NonceCheck`]): one message to Redis, one
//!   reply. Memory is 93 bytes a nonce (84 in a set, 133 as keys), i.e. 93 B x requests/s x
//!   (max_skew_s + 1) (87 MB at 30,000 requests/s and the default 30 s window). Redis down,
//!   or refusing the check (out of memory, a read-only replica): the check is skipped and the
//!   request goes on with its sidecar's own check (a replayed read changes nothing, and writes
//!   have the next line), except for a cache write, which Redis alone guards: its check is
//!   never skipped ([`SharedNonces::require`]);
//! - in Postgres, for every write (`/v1/execute`, `/v1/transaction`): a row in `auth.nonce_table`,
//!   inserted inside the write's own transaction, in the round trip of its COMMIT, with the rows
//!   it affected. A second run of the same write fails on the row (unique) and rolls back, so a
//!   write commits at most once, with Redis up or down and however many sidecars. A write that
//!   fails leaves the row too (with no rows count), so it cannot be replayed either. Rows are
//!   swept once their window has passed. Read-only transactions commit the row first instead:
//!   they cannot insert it in their own.
//!
//! Because the row commits exactly when the write does, it is also the write's outcome:
//! [`outcome`] tells whether a write committed, and fences it if not (it inserts the row, so the
//! write can never commit later; a write still in flight is waited for). A sidecar that loses
//! its connection during a COMMIT asks it before answering; an edge whose sidecar died asks it
//! through another one (`POST /v1/outcome`). So a write fails cleanly or succeeds, never both.

use crate::error::ApiError;
use crate::store::coordination::nonces::seen::Seen;
use crate::store::pools::session::rollback;
use crate::store::pools::Pools;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::failure::{commit_lost, connection_lost};
use crate::store::postgres::PgSession;
use postgres::error::SqlState;
use std::sync::{Arc, Weak};
use std::time::Duration;

mod books;
mod check;
pub(crate) mod outcome;
pub(crate) mod seen;
pub(crate) use books::Books;
pub(crate) use check::{settle, NonceCheck};

/// Where nonces are shared, fixed at startup.
#[derive(Debug, Clone)]
pub(crate) struct SharedNonces {
    /// None: `auth.replay = "local"` (one sidecar only).
    shared: Option<Shared>,
}

#[derive(Debug, Clone)]
struct Shared {
    /// `cache.key_prefix`.
    prefix: String,
    books: Arc<Books>,
    /// Seconds a write's row is kept: twice the clock window, whatever the clocks say.
    keep_s: u64,
}

/// A write's nonce, for its round trips to Postgres.
#[derive(Debug, Clone)]
pub(crate) struct WriteNonce {
    pub(in crate::store) books: Arc<Books>,
    pub(in crate::store) hex: String,
    keep_s: u64,
}

impl SharedNonces {
    /// `grantee`: the role requests run as, which may call Ferry's record function.
    pub(crate) fn new(
        shared: bool,
        prefix: &str,
        table: &str,
        max_skew_s: u64,
        grantee: Option<String>,
    ) -> SharedNonces {
        SharedNonces {
            shared: shared.then(|| Shared {
                prefix: prefix.to_string(),
                books: Books::new(table, grantee),
                keep_s: 2 * max_skew_s + 2,
            }),
        }
    }

    /// The row a write records before it runs (None with `auth.replay = "local"`).
    pub(crate) fn for_write(&self, seen: Seen) -> Option<WriteNonce> {
        self.shared.as_ref().map(|s| WriteNonce {
            books: s.books.clone(),
            hex: seen.hex(),
            keep_s: s.keep_s,
        })
    }

    /// The write signed with `nonce` (the `x-ferry-nonce` it was sent with), for
    /// `POST /v1/outcome`; None with `auth.replay = "local"` (no outcome is kept).
    pub(crate) fn for_outcome(&self, nonce: &str) -> Option<WriteNonce> {
        self.shared.as_ref().map(|s| WriteNonce {
            books: s.books.clone(),
            hex: format!("{:032x}", seen::fingerprint(nonce)),
            keep_s: s.keep_s,
        })
    }

    /// Makes sure of the books (as Ferry's own role), then deletes expired rows every 10 s,
    /// until the pools go (each sidecar sweeps; a row deleted twice is no harm).
    pub(crate) fn spawn_sweeper(
        &self,
        background: &crate::background::Background,
        pools: Weak<Pools>,
    ) {
        let Some(s) = self.shared.clone() else {
            return;
        };
        background.every(
            "ferry-nonce-sweep",
            "expired write outcomes are not deleted",
            Duration::from_secs(10),
            move || {
                let Some(pools) = pools.upgrade() else {
                    return false;
                };
                let swept = crate::store::pools::session::with_owner_session(&pools, |session| {
                    s.books.make_sure(session)?;
                    session
                        .client
                        .batch_execute(&format!(
                            "BEGIN READ WRITE; DELETE FROM {} WHERE expires_at < now(); COMMIT",
                            s.books.table
                        ))
                        .map_err(|e| {
                            rollback(session);
                            Failure::from(e)
                        })
                });
                if let Err(e) = swept {
                    tracing::debug!(error = %e.into_api(), "nonce sweep skipped");
                }
                true
            },
        );
    }
}

impl WriteNonce {
    /// Seconds its row is kept.
    pub(in crate::store) fn keep_s(&self) -> u64 {
        self.keep_s
    }

    /// The call that records the row, with the rows the write affected (None: it did not
    /// commit); `if_absent`: a row already there stays. Err until the books are made sure of.
    pub(in crate::store) fn record(
        &self,
        rows: Option<u64>,
        if_absent: bool,
    ) -> Result<String, Failure> {
        self.books
            .record_call(&self.hex, self.keep_s, rows, if_absent)
            .ok_or_else(|| Failure::Api(ApiError::internal("Ferry's books are not ready")))
    }

    /// The row committed on its own, before a read-only transaction (which cannot record it).
    fn insert(&self) -> Result<String, Failure> {
        Ok(format!(
            "BEGIN READ WRITE; {}; COMMIT",
            self.record(None, false)?
        ))
    }

    /// Makes sure of the books before a write's first statement: on a session of Ferry's own
    /// role (or on `s` itself with `postgres.single_role`). A failure is the operator's to fix
    /// (the log says how), never the caller's: 500 without detail.
    pub(in crate::store) fn ensure_books(
        &self,
        pools: &Pools,
        s: &mut PgSession,
    ) -> Result<(), Failure> {
        if self.books.ready() {
            return Ok(());
        }
        let made = if pools.has_owner_pool() {
            crate::store::pools::session::with_owner_session(pools, |o| self.books.make_sure(o))
        } else {
            self.books.make_sure(s)
        };
        match made {
            Ok(()) => Ok(()),
            Err(Failure::Pg(e)) if !connection_lost(&e) => Err(Failure::Api(ApiError::internal(
                format!("auth.nonce_table {} is not usable: {e}", self.books.table),
            ))),
            Err(f) => Err(f),
        }
    }
}

/// Opens a write's transaction (`begin`: `BEGIN READ WRITE ...`), one round trip. A session
/// found lost here sent nothing: `Failure::Unsent`, and the caller may take another.
pub(in crate::store) fn begin(
    pools: &Pools,
    s: &mut PgSession,
    nonce: Option<&WriteNonce>,
    begin: &str,
) -> Result<(), Failure> {
    if let Some(n) = nonce {
        // Nothing of the write's is sent before this either.
        n.ensure_books(pools, s).map_err(|f| match f {
            Failure::Closed(e) | Failure::Pg(e) if connection_lost(&e) => unsent_if_lost(s, e),
            f => f,
        })?;
    }
    s.client
        .batch_execute(begin)
        .map_err(|e| unsent_if_lost(s, e))
}

/// Records the nonce with the rows the write affected, and commits, in one round trip. The
/// nonce already there: another run of this write committed (a replay), so this one is rolled
/// back and refused. The connection lost meanwhile: the COMMIT may or may not have happened,
/// so the write's [`outcome`] is asked on another session before answering.
pub(in crate::store) fn commit(
    pools: &Pools,
    s: &mut PgSession,
    nonce: Option<&WriteNonce>,
    rows: u64,
    as_user: bool,
) -> Result<(), Failure> {
    let Some(n) = nonce else {
        return s.client.batch_execute("COMMIT").map_err(|e| {
            rollback(s);
            commit_lost(e)
        });
    };
    // The row is Ferry's, written as the login role: a write run as an end user's role
    // (identity) gets its deferred checks run as that user first, then the role is put back.
    let back = if as_user {
        "SET CONSTRAINTS ALL IMMEDIATE; RESET ROLE; "
    } else {
        ""
    };
    let sql = format!("{back}{}; COMMIT", n.record(Some(rows), false)?);
    let Err(e) = s.client.batch_execute(&sql) else {
        return Ok(());
    };
    if connection_lost(&e) {
        s.poisoned = true;
        return match crate::store::coordination::nonces::outcome::outcome_patiently(pools, n) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Failure::Api(ApiError::DatabaseUnavailable {
                internal: format!("connection lost before the commit; it did not commit: {e}"),
            })),
            // Never a plain failure: the write may well have committed.
            Err(unknown) => Err(Failure::Api(ApiError::OutcomeUnknown {
                kept: true,
                internal: format!("connection lost during the commit ({e}); then: {unknown}"),
            })),
        };
    }
    rollback(s);
    match e.code() {
        Some(c) if *c == SqlState::UNIQUE_VIOLATION => Err(Failure::Api(ApiError::Replayed)),
        _ => Err(Failure::from(e)),
    }
}

/// After a write failed and was rolled back: its nonce is recorded anyway (as not committed),
/// so the same request sent again is refused. Best effort: Redis's record stands too.
pub(in crate::store) fn refuse_replays(s: &mut PgSession, nonce: Option<&WriteNonce>) {
    let Some(n) = nonce else {
        return;
    };
    if s.poisoned || s.client.is_closed() {
        return;
    }
    let Ok(call) = n.record(None, true) else {
        return;
    };
    if let Err(e) = s
        .client
        .batch_execute(&format!("BEGIN READ WRITE; {call}; COMMIT"))
    {
        tracing::debug!(error = %e, "a failed write's nonce was not recorded");
        rollback(s);
    }
}

fn unsent_if_lost(s: &mut PgSession, e: postgres::Error) -> Failure {
    if connection_lost(&e) {
        s.poisoned = true;
        Failure::Unsent(e)
    } else {
        Failure::from(e)
    }
}

/// Sends `then` on `s`, preceded, in the same round trip, by the nonce's row, committed first
/// (read-only transactions). A nonce already there: Replayed.
pub(in crate::store) fn record_then(
    pools: &Pools,
    s: &mut PgSession,
    nonce: Option<&WriteNonce>,
    then: &str,
) -> Result<(), Failure> {
    let Some(n) = nonce else {
        return s
            .client
            .batch_execute(then)
            .map_err(|e| unsent_if_lost(s, e));
    };
    n.ensure_books(pools, s)?;
    let batch = format!("{}; {then}", n.insert()?);
    let Err(e) = s.client.batch_execute(&batch) else {
        return Ok(());
    };
    if connection_lost(&e) {
        // Nothing of the caller's ran: the caller may take another connection.
        s.poisoned = true;
        return Err(Failure::Unsent(e));
    }
    rollback(s);
    match e.code() {
        Some(c) if *c == SqlState::UNIQUE_VIOLATION => Err(Failure::Api(ApiError::Replayed)),
        _ => Err(Failure::from(e)),
    }
}

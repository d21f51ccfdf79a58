//! Replay protection across sidecars (`auth.replay = "shared"`, the default). Every sidecar
//! first checks its own memory (`http::replay`), which alone is enough for one sidecar. Behind
//! a load balancer a captured request could be replayed to another one, so each nonce is also
//! recorded where every sidecar looks:
//!
//! - in Redis, for every signed request: its 16-byte fingerprint added to one set per signed
//!   second (`SADD`, 0 = seen before), the set expiring once that second leaves the clock window
//!   (`EXPIREAT`, in the same round trip). One set per second rather than one key per nonce:
//!   Redis then neither creates nor expires a key per request. Measured (bench `scale`): a
//!   signed cache GET cost Redis 3.4x the CPU of the GET alone with a key per nonce, 1.5x with
//!   sets sent in the same write as the lookup (`routes::signed_json_unshared`); memory is 80 bytes a nonce (133 as keys), i.e. 80 B x requests/s x (max_skew_s + 1)
//!   (75 MB at 30,000 requests/s and the default 30 s window). Redis down: the check is
//!   skipped and the request goes on with its sidecar's own check (a replayed read changes
//!   nothing, and writes have the next line);
//! - in Postgres, for every write (`/v1/execute`, `/v1/transaction`): a row in `auth.nonce_table`,
//!   inserted in the same round trip as the write's first statement and committed before it
//!   runs, so a write is never run twice, with Redis up or down and however many sidecars.
//!   Rows are swept once their window has passed.

use crate::http::error::ApiError;
use crate::http::replay::Seen;
use crate::store::db::{rollback, with_session, Failure};
use crate::store::ferry_tables;
use crate::store::pools::Pools;
use crate::store::postgres::PgSession;
use postgres::error::SqlState;
use std::sync::Weak;
use std::time::Duration;

/// The nonce table's columns (created if missing: `store::ferry_tables`).
const COLUMNS: &str = "(nonce bytea PRIMARY KEY, expires_at timestamptz NOT NULL)";

/// Where nonces are shared, fixed at startup.
#[derive(Debug, Clone)]
pub struct SharedNonces {
    /// None: `auth.replay = "local"` (one sidecar only).
    shared: Option<Shared>,
}

#[derive(Debug, Clone)]
struct Shared {
    /// `cache.key_prefix`.
    prefix: String,
    /// `auth.nonce_table`, validated (`schema.table`, unquoted identifiers).
    table: String,
    /// Seconds a write's row is kept: twice the clock window, whatever the clocks say.
    keep_s: u64,
}

/// A write's nonce, for its first round trip to Postgres.
#[derive(Debug, Clone)]
pub struct WriteNonce {
    table: String,
    hex: String,
    keep_s: u64,
}

impl SharedNonces {
    pub fn new(shared: bool, prefix: &str, table: &str, max_skew_s: u64) -> SharedNonces {
        SharedNonces {
            shared: shared.then(|| Shared {
                prefix: prefix.to_string(),
                table: table.to_string(),
                keep_s: 2 * max_skew_s + 2,
            }),
        }
    }

    /// Records a request's nonce in Redis; refuses one another sidecar has seen.
    pub async fn check(&self, pools: &Pools, seen: Seen) -> Result<(), ApiError> {
        let Some(s) = &self.shared else {
            return Ok(());
        };
        let key = format!("{}n:{}", s.prefix, seen.timestamp);
        let mut pipe = redis::pipe();
        pipe.cmd("SADD")
            .arg(&key)
            .arg(&seen.fingerprint.to_le_bytes()[..])
            // A few seconds past the window, in case Redis's clock is behind ours.
            .cmd("EXPIREAT")
            .arg(&key)
            .arg(seen.until_s + 5)
            .ignore();
        let reply = match pools.redis_async().await {
            Ok(Some(mut conn)) => {
                let r = pipe.query_async::<(i64,)>(&mut conn).await;
                if r.is_err() {
                    pools.drop_redis_async();
                }
                r
            }
            // No multiplexed connection while the breaker is open: Redis is down.
            Ok(None) | Err(_) => return Ok(()),
        };
        match reply {
            Ok((1,)) => Ok(()),
            Ok(_) => Err(ApiError::Replayed),
            Err(e) => {
                tracing::debug!(error = %e, "shared replay check skipped: redis failed");
                Ok(())
            }
        }
    }

    /// The row a write records before it runs (None with `auth.replay = "local"`).
    pub fn for_write(&self, seen: Seen) -> Option<WriteNonce> {
        self.shared.as_ref().map(|s| WriteNonce {
            table: s.table.clone(),
            hex: seen.hex(),
            keep_s: s.keep_s,
        })
    }

    /// Creates the table if missing, then deletes expired rows every 10 s, until the pools
    /// go (each sidecar sweeps; a row deleted twice is no harm).
    pub fn spawn_sweeper(&self, pools: Weak<Pools>) {
        let Some(s) = self.shared.clone() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("ferry-nonce-sweep".into())
            .spawn(move || loop {
                let Some(pools) = pools.upgrade() else {
                    return;
                };
                let swept = with_session(&pools, |session| {
                    ferry_tables::ensure(session, &s.table, COLUMNS)?;
                    session
                        .client
                        .batch_execute(&format!(
                            "BEGIN READ WRITE; DELETE FROM {} WHERE expires_at < now(); COMMIT",
                            s.table
                        ))
                        .map_err(|e| {
                            rollback(session);
                            Failure::from(e)
                        })
                });
                if let Err(e) = swept {
                    tracing::debug!(error = %e.into_api(), "nonce sweep skipped");
                }
                drop(pools);
                std::thread::sleep(Duration::from_secs(10));
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the nonce sweeper thread");
        }
    }
}

impl WriteNonce {
    fn insert(&self) -> String {
        // Only our own hex and a validated table name are spliced in (decode: no backslash,
        // whatever standard_conforming_strings says).
        format!(
            "BEGIN READ WRITE; INSERT INTO {} (nonce, expires_at) \
             VALUES (decode('{}', 'hex'), now() + make_interval(secs => {})); COMMIT",
            self.table, self.hex, self.keep_s
        )
    }
}

/// Sends `then` on `s`, preceded, in the same round trip, by the write's nonce row (committed
/// first, so a replay is refused even if the write then fails). A nonce already there: Replayed.
pub(super) fn record_then(
    s: &mut PgSession,
    nonce: Option<&WriteNonce>,
    then: &str,
) -> Result<(), Failure> {
    let Some(n) = nonce else {
        return s.client.batch_execute(then).map_err(|e| {
            if connection_lost(&e) {
                s.poisoned = true;
                Failure::Unsent(e)
            } else {
                Failure::from(e)
            }
        });
    };
    let batch = format!("{}; {then}", n.insert());
    let mut created = false;
    loop {
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
            Some(c) if *c == SqlState::UNIQUE_VIOLATION => {
                return Err(Failure::Api(ApiError::Replayed))
            }
            Some(c) if *c == SqlState::UNDEFINED_TABLE && !created => {
                // The sweeper has not created it yet (the first write after startup).
                ferry_tables::ensure(s, &n.table, COLUMNS)?;
                created = true;
            }
            _ => return Err(Failure::from(e)),
        }
    }
}

/// The session is gone (closed, or Postgres terminated it: a restart leaves pooled sessions
/// that learn it on their next statement), as opposed to a statement that failed.
pub(super) fn connection_lost(e: &postgres::Error) -> bool {
    e.is_closed()
        || e.code()
            .is_some_and(|c| c.code().starts_with("57P") || c.code().starts_with("08"))
}

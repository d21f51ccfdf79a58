//! The shared replay check in Redis of a signed request (`HSETNX` of its nonce into its signed
//! second's hash, `HGET` of it, then `EXPIREAT`), sent in front of a read's own pipeline or on
//! its own.

use super::SharedNonces;
use crate::error::ApiError;
use crate::store::blocking::Blocking;
use crate::store::coordination::nonces::seen::Seen;
use crate::store::pools::send::{redis_down, send, How};
use crate::store::pools::Pools;
use redis::{RedisResult, Value};
use std::sync::Arc;

/// The shared replay check of one request: its nonce's fingerprint set in the hash of its
/// signed second to a token of this request's own, if no request set it before (`HSETNX`);
/// the token it holds now (`HGET`: the verdict); then `EXPIREAT` of the hash. It rides in
/// front of a read's own pipeline, so both cost Redis one message, the sidecar one reply and
/// one timer. The token makes it safe to send twice: on a connection Redis ended, this
/// request's earlier attempt may have set it, and finding its own token is still a first
/// sighting, where another request's token is a replay.
#[must_use = "the shared replay check must run before the request takes effect"]
pub(crate) struct NonceCheck {
    key: String,
    field: [u8; 16],
    token: [u8; 8],
    expire_at: u64,
}

/// What the check's replies say.
enum Said {
    First,
    Replayed,
    /// Redis refused a command (out of memory, a read-only replica) or answered oddly.
    Unsettled,
}

impl NonceCheck {
    /// How many replies its commands take at the front of a pipeline's answer. No command is
    /// `ignore`d: a cluster connection splits a pipeline by slot, which keeps every reply but
    /// not the marks.
    pub(crate) const REPLIES: usize = 3;

    /// Adds the check's commands to `pipe`, and has each command of `pipe` answer for itself
    /// (`ignore_errors`), so a server's error to the request's own command cannot take the
    /// verdict with it: send it with `How::each`.
    pub(crate) fn add_to(&self, pipe: &mut redis::Pipeline) {
        pipe.ignore_errors();
        pipe.cmd("HSETNX")
            .arg(&self.key)
            .arg(&self.field[..])
            .arg(&self.token[..])
            .cmd("HGET")
            .arg(&self.key)
            .arg(&self.field[..])
            .cmd("EXPIREAT")
            .arg(&self.key)
            .arg(self.expire_at);
    }

    fn said(&self, replies: &[Value]) -> Said {
        match replies {
            [Value::Int(_), Value::BulkString(t), ..] if t[..] == self.token[..] => Said::First,
            [Value::Int(_), Value::BulkString(_), ..] => Said::Replayed,
            other => {
                tracing::debug!(reply = ?other.get(..2), "shared replay check: unexpected reply");
                Said::Unsettled
            }
        }
    }

    /// The verdict of a pipeline's answer whose first replies are this check's. Redis
    /// refusing it skips it, as Redis down does.
    pub(crate) fn verdict(&self, replies: &[Value]) -> Result<(), ApiError> {
        match self.said(replies) {
            Said::Replayed => Err(ApiError::Replayed),
            Said::First | Said::Unsettled => Ok(()),
        }
    }

    /// The verdict of a check that may not be skipped ([`SharedNonces::require`]): Redis
    /// refusing it is Redis trouble.
    fn required(&self, replies: &[Value]) -> Result<(), ApiError> {
        match self.said(replies) {
            Said::First => Ok(()),
            Said::Replayed => Err(ApiError::Replayed),
            Said::Unsettled => Err(ApiError::CacheUnavailable {
                internal: format!("shared replay check not settled: {:?}", replies.first()),
            }),
        }
    }

    /// The verdict from the answer of a pipeline this check rode in front of (None without a
    /// check), and the answers of the pipeline's other commands, each server error turned back
    /// into an `Err`. A pipeline that failed as a whole (Redis down or hung, which trips the
    /// breaker) skips the check, as [`SharedNonces::run`] does.
    pub(crate) fn split(
        check: Option<&NonceCheck>,
        answer: RedisResult<Vec<Value>>,
    ) -> (Option<Result<(), ApiError>>, RedisResult<Vec<Value>>) {
        if check.is_none() {
            return (None, answer);
        }
        match answer {
            Ok(replies) => {
                let front = Self::REPLIES.min(replies.len());
                let verdict = check.map(|c| c.verdict(&replies[..front]));
                let rest = replies.into_iter().skip(front).map(Value::extract_error);
                (verdict, rest.collect())
            }
            Err(e) => {
                tracing::debug!(error = %e, "shared replay check skipped: redis failed");
                (Some(Ok(())), Err(e))
            }
        }
    }
}

/// The verdict of a check that rode in front of a read's commands (`sent`), or else the check
/// run on its own (the read's commands did not go to Redis on the event loop).
pub(crate) async fn settle(
    stores: (&Arc<Pools>, &Blocking),
    check: Option<NonceCheck>,
    sent: Option<Result<(), ApiError>>,
) -> Result<(), ApiError> {
    match (sent, check) {
        (Some(verdict), _) => verdict,
        (None, Some(check)) => SharedNonces::run(stores, &check).await,
        (None, None) => Ok(()),
    }
}

impl SharedNonces {
    /// The shared check of a request's nonce, ready to send (None with `auth.replay =
    /// "local"`). A read sends it in front of its own commands ([`NonceCheck::add_to`]);
    /// anything else, or a read whose commands do not go to Redis, sends it alone ([`run`]).
    ///
    /// [`run`]: SharedNonces::run
    pub(crate) fn prepare(&self, seen: &Seen) -> Option<NonceCheck> {
        self.shared.as_ref().map(|s| NonceCheck {
            // `nh:`, not the `n:` sets of earlier versions (another type under the same name).
            key: format!("{}nh:{}", s.prefix, seen.timestamp),
            field: seen.fingerprint.to_le_bytes(),
            token: rand::random(),
            // A few seconds past the window, in case Redis's clock is behind ours.
            expire_at: seen.until_s + 5,
        })
    }

    /// Records a request's nonce in Redis; refuses one another sidecar has seen.
    pub(crate) async fn check(
        &self,
        stores: (&Arc<Pools>, &Blocking),
        seen: Seen,
    ) -> Result<(), ApiError> {
        match self.prepare(&seen) {
            Some(check) => Self::run(stores, &check).await,
            None => Ok(()),
        }
    }

    /// The check of a request whose effect Redis alone guards (a cache write: Postgres keeps
    /// no row for it), made or the request refused. Unlike [`check`](Self::check) it is never
    /// skipped: Redis failing or its breaker open, the answer is 503 (the write itself needs
    /// Redis anyway), where a skipped check would let a replay to another sidecar run the write
    /// twice. A check cut off by a lost connection is asked again once on a fresh one (its
    /// token tells its own earlier attempt from another request).
    pub(crate) async fn require(
        &self,
        pools: &Arc<Pools>,
        blocking: &Blocking,
        seen: Seen,
    ) -> Result<(), ApiError> {
        let Some(check) = self.prepare(&seen) else {
            return Ok(());
        };
        let mut pipe = redis::pipe();
        check.add_to(&mut pipe);
        let how = How {
            each: true,
            again: true,
        };
        match send(pools, blocking, &pipe, how).await? {
            Ok(replies) => check.required(&replies),
            Err(e) => {
                pools.redis_failed(&e);
                Err(unavailable(e))
            }
        }
    }

    /// Sends a prepared check on its own. Skipped while the breaker is open (Redis is down:
    /// the request goes on with its sidecar's own check), and when Redis fails or refuses it:
    /// a replayed read changes nothing, and writes have their row in Postgres.
    pub(crate) async fn run(
        (pools, blocking): (&Arc<Pools>, &Blocking),
        check: &NonceCheck,
    ) -> Result<(), ApiError> {
        if !pools.redis_breaker_closed() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        check.add_to(&mut pipe);
        let how = How {
            each: true,
            again: true,
        };
        match send(pools, blocking, &pipe, how).await {
            Ok(Ok(replies)) => check.verdict(&replies),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "shared replay check skipped: redis failed");
                Ok(())
            }
            Err(e) if redis_down(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn unavailable(e: redis::RedisError) -> ApiError {
    ApiError::CacheUnavailable {
        internal: format!("shared replay check: {e}"),
    }
}

//! The shared replay check in Redis of a signed request (`SADD` to its signed second's set,
//! then `EXPIREAT`), sent in front of a read's own pipeline or on its own.

use super::SharedNonces;
use crate::error::ApiError;
use crate::store::blocking::Blocking;
use crate::store::coordination::nonces::seen::Seen;
use crate::store::pools::send::{redis_down, send, How, Sent};
use crate::store::pools::Pools;
use redis::{RedisResult, Value};
use std::sync::Arc;

/// The shared replay check of one request: SADD of its nonce's fingerprint to the set of its
/// signed second (the reply is the verdict), then EXPIREAT of that set. It rides in front of a
/// read's own pipeline, so both cost Redis one message, the sidecar one reply and one timer.
#[must_use = "the shared replay check must run before the request takes effect"]
pub(crate) struct NonceCheck {
    key: String,
    member: [u8; 16],
    expire_at: u64,
}

impl NonceCheck {
    /// How many replies its commands take at the front of a pipeline's answer. Neither
    /// command is `ignore`d: a cluster connection splits a pipeline by slot, which keeps every
    /// reply but not the marks.
    pub(crate) const REPLIES: usize = 2;

    /// Adds the check's commands to `pipe`, and has each command of `pipe` answer for itself
    /// (`ignore_errors`), so a server's error to the request's own command cannot take the
    /// verdict with it: send it with `AsyncConn::query_pipe_each`.
    pub(crate) fn add_to(&self, pipe: &mut redis::Pipeline) {
        pipe.ignore_errors();
        pipe.cmd("SADD")
            .arg(&self.key)
            .arg(&self.member[..])
            .cmd("EXPIREAT")
            .arg(&self.key)
            .arg(self.expire_at);
    }

    /// The verdict of a pipeline's answer whose first replies are this check's: 1 added (a
    /// first sighting), 0 seen by some sidecar before.
    pub(crate) fn verdict(replies: &[Value]) -> Result<(), ApiError> {
        match replies {
            [Value::Int(1), ..] => Ok(()),
            [Value::Int(_), ..] => Err(ApiError::Replayed),
            other => {
                tracing::debug!(reply = ?other.first(), "shared replay check skipped: unexpected reply");
                Ok(())
            }
        }
    }

    /// The verdict of a check that may not be skipped ([`SharedNonces::require`]): 1 is a
    /// first sighting; 0 a replay, unless this was a second attempt (then it may be the
    /// first's own SADD); anything else, Redis trouble.
    fn required(replies: &[Value], again: bool) -> Result<(), ApiError> {
        match replies {
            [Value::Int(1), ..] => Ok(()),
            [Value::Int(0), ..] if !again => Err(ApiError::Replayed),
            other => Err(ApiError::CacheUnavailable {
                internal: format!("shared replay check not settled: {:?}", other.first()),
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
                let verdict = Self::verdict(&replies[..front]);
                let rest = replies.into_iter().skip(front).map(Value::extract_error);
                (Some(verdict), rest.collect())
            }
            Err(e) => {
                tracing::debug!(error = %e, "shared replay check skipped: redis failed");
                (Some(Ok(())), Err(e))
            }
        }
    }
}

impl NonceCheck {
    /// [`NonceCheck::split`] of what `send` answered: sent again (its connection lost), the
    /// pipeline went without the check, which is then skipped, as when Redis fails.
    pub(crate) fn split_sent(
        check: Option<&NonceCheck>,
        sent: Sent,
    ) -> (Option<Result<(), ApiError>>, RedisResult<Vec<Value>>) {
        match sent.again {
            false => Self::split(check, sent.values),
            true => (
                check.map(|_| Ok(())),
                sent.values
                    .and_then(|v| v.into_iter().map(Value::extract_error).collect()),
            ),
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
            key: format!("{}n:{}", s.prefix, seen.timestamp),
            member: seen.fingerprint.to_le_bytes(),
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
    /// twice. While the breaker is open it goes over a pooled connection (the path that probes
    /// Redis). A check cut off by a lost connection is asked again once on a fresh one; "seen"
    /// then may be this request's own first SADD, so that is 503 too, never a replay verdict
    /// the request did not earn, and never the write run twice.
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
            front: 0,
            again: true,
        };
        let sent = send(pools, blocking, &pipe, how).await?;
        match sent.values {
            Ok(replies) => NonceCheck::required(&replies, sent.again),
            Err(e) => {
                pools.redis_failed(&e);
                Err(unavailable(e))
            }
        }
    }

    /// Sends a prepared check on its own. Skipped while the breaker is open (Redis is down:
    /// the request goes on with its sidecar's own check), and when Redis fails it: a replayed
    /// read changes nothing, and writes have their row in Postgres. Never sent twice (a second
    /// SADD would find the first's).
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
            ..How::default()
        };
        match send(pools, blocking, &pipe, how).await {
            Ok(Sent {
                values: Ok(replies),
                ..
            }) => NonceCheck::verdict(&replies),
            Ok(Sent { values: Err(e), .. }) => {
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

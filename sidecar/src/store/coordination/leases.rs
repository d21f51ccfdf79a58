//! Single flight across sidecars: the first sidecar to miss on a read takes a short lease in
//! Redis (`SET NX PX`) and fills it; another sidecar that misses meanwhile waits to be woken
//! by the fill instead of running the same query. A waiter marks the lease as waited on
//! (`<lease>:waiting`) and checks that it is still held, in one message; the holder's release
//! deletes the lease and, only when the mark is there, deletes it and publishes the lease's
//! name on one channel, in one script. Each sidecar keeps one subscriber connection and wakes
//! its own waiters. So a miss nobody waits on publishes nothing (a publish costs Redis and
//! every sidecar's subscriber a message: measured in the blog bench, most misses). No busy polling: a waiter sleeps on a channel
//! until it is woken, finds the lease gone (checked about once a second), or its wait (half the
//! request deadline) runs out.
//!
//! No wake-up is lost: a waiter registers (in this sidecar) before it tries the lease; Redis runs
//! the release script either before the waiter's mark (the waiter then finds the lease gone
//! and does not wait) or after it (the release then sees the mark and publishes). A holder that dies
//! mid-fill stops renewing its lease (2 s, renewed every 0.7 s while the fill runs): its waiters
//! find it gone within about 3 s and run the query themselves. Redis down: no lease is taken
//! and each sidecar runs its own query (its local single flight still holds).

use crate::store::pools::Pools;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// How long a lease lasts unless its holder renews it (every `RENEW_EVERY`): a holder that dies
/// mid-fill frees its read within this.
pub(crate) const LEASE: Duration = Duration::from_millis(2_000);
const RENEW_EVERY: Duration = Duration::from_millis(700);

/// KEYS[1] the lease; ARGV[1] the holder's token, ARGV[2] milliseconds.
static RENEW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
        if redis.call('GET', KEYS[1]) == ARGV[1] then
          return redis.call('PEXPIRE', KEYS[1], ARGV[2])
        end
        return 0
        ",
    )
});

/// KEYS[1] the lease, KEYS[2] its waited-on mark; ARGV[1] the holder's token, ARGV[2] the
/// channel. A lease no longer ours (it lapsed, another sidecar holds it) is left, with its
/// mark, to its holder.
const RELEASE_LUA: &str = r"
        if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
        redis.call('DEL', KEYS[1])
        if redis.call('DEL', KEYS[2]) == 1 then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
        return 1
        ";
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RELEASE_LUA));

/// The mark a waiter puts on `lease` (the same hash slot: the lease's name is its hash tag).
fn waiting_mark(lease: &str) -> String {
    format!("{lease}:waiting")
}

pub(crate) struct Leases {
    /// False without a connection for wake-ups: misses are then not shared across sidecars
    /// (a waiter would sleep until its wait ran out).
    enabled: bool,
    prefix: String,
    channel: String,
    /// Lease name -> the waiters of this sidecar.
    waiting: Mutex<HashMap<String, watch::Sender<bool>>>,
}

/// What trying a lease gave.
pub(crate) enum Lease {
    /// This sidecar fills; release it when done.
    Held { key: String, token: String },
    /// Another sidecar fills: wait on it.
    Taken(Waiter),
    /// Redis unavailable: fill without a lease.
    Unavailable,
}

/// A lease this sidecar holds, handed to its fill: released behind the fill's write-back, in
/// the same round trip (`Cache::store`), instead of in one of its own.
pub(crate) struct Held {
    pub key: String,
    pub token: String,
    pub leases: Arc<Leases>,
}

impl Held {
    pub(crate) fn release_in(&self, pipe: &mut redis::Pipeline) {
        self.leases.release_in(pipe, &self.key, &self.token);
    }
}

/// A lease asked for, not yet sent: its `SET NX PX` goes out on its own ([`Attempt::send`]) or
/// in front of other commands ([`Attempt::add_to`], then [`Attempt::settle`] with its reply).
pub(crate) struct Attempt {
    key: String,
    token: String,
    waiter: Waiter,
}

impl Attempt {
    /// Adds the lease's `SET NX GET PX` to `pipe`. GET: a `SET` sent again (its connection
    /// was lost) finds its own token and knows the lease is ours.
    pub(crate) fn add_to(&self, pipe: &mut redis::Pipeline) {
        pipe.cmd("SET")
            .arg(&self.key)
            .arg(&self.token)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(LEASE.as_millis() as u64);
    }

    /// Sends the `SET` on its own.
    pub(crate) async fn send(self, pools: &Pools) -> Lease {
        let Ok(Some(mut conn)) = pools.redis_async().await else {
            return Lease::Unavailable;
        };
        let mut pipe = redis::pipe();
        self.add_to(&mut pipe);
        match conn.query_pipe_each(&pipe).await {
            Ok(replies) => self.settle(replies.into_iter().next()),
            Err(e) => {
                pools.drop_redis_async();
                tracing::debug!(error = %e, "no fill lease: redis failed");
                Lease::Unavailable
            }
        }
    }

    /// What the `SET`'s reply (the lease's holder before it) means: none or our own token,
    /// ours; another token, another sidecar's; anything else (an error, no reply) leaves the
    /// fill without a lease.
    pub(crate) fn settle(self, reply: Option<redis::Value>) -> Lease {
        match reply {
            Some(redis::Value::Nil) => Lease::Held {
                key: self.key,
                token: self.token,
            },
            Some(redis::Value::BulkString(t)) if t == self.token.as_bytes() => Lease::Held {
                key: self.key,
                token: self.token,
            },
            Some(redis::Value::BulkString(_)) => Lease::Taken(self.waiter),
            other => {
                tracing::debug!(reply = ?other, "no fill lease: unexpected reply");
                Lease::Unavailable
            }
        }
    }
}

pub(crate) struct Waiter {
    key: String,
    /// Taken out only by `drop`, which lets it go before it looks at the registration.
    rx: Option<watch::Receiver<bool>>,
    leases: Arc<Leases>,
}

impl Leases {
    pub(crate) fn new(prefix: &str, enabled: bool) -> Arc<Leases> {
        Arc::new(Leases {
            enabled,
            prefix: prefix.to_string(),
            channel: format!("{prefix}filled"),
            waiting: Mutex::default(),
        })
    }

    /// Whether misses are shared across sidecars (a connection is set aside for wake-ups).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    fn waiting(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<bool>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease of the read `identity` (`CachePlan::flight_identity`), ready to send (None
    /// when misses are not shared).
    pub(crate) fn attempt(self: &Arc<Self>, identity: &str) -> Option<Attempt> {
        if !self.enabled {
            return None;
        }
        let digest = hex::encode(Sha256::digest(identity.as_bytes()));
        // The digest in braces is the hash tag: on a cluster the lease and its mark share a
        // slot, as the release script needs.
        let key = format!("{}lease:{{{}}}", self.prefix, &digest[..32]);
        // Registered first, so a release between our SET and our wait still wakes us.
        let rx = self
            .waiting()
            .entry(key.clone())
            .or_insert_with(|| watch::channel(false).0)
            .subscribe();
        let waiter = Waiter {
            key: key.clone(),
            rx: Some(rx),
            leases: self.clone(),
        };
        let token = hex::encode(rand::random::<[u8; 16]>());
        Some(Attempt { key, token, waiter })
    }

    /// Keeps the lease while the fill runs (never returns: drop it when the fill is done).
    pub(crate) async fn renew(&self, pools: &Pools, key: &str, token: &str) {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            if let Ok(Some(mut conn)) = pools.redis_async().await {
                let renewed = RENEW
                    .key(key)
                    .arg(token)
                    .arg(LEASE.as_millis() as u64)
                    .invoke_async::<i64>(&mut conn)
                    .await;
                if renewed.is_err() {
                    pools.drop_redis_async();
                }
            }
        }
    }

    /// Whether someone holds the lease `key` now (an error counts as no: fill ourselves).
    pub(crate) async fn held(&self, pools: &Pools, key: &str) -> bool {
        let Ok(Some(mut conn)) = pools.redis_async().await else {
            return false;
        };
        redis::cmd("EXISTS")
            .arg(key)
            .query_async::<i64>(&mut conn)
            .await
            .is_ok_and(|n| n == 1)
    }

    /// Ends a fill (done or failed): deletes the lease if still ours and wakes every waiter.
    /// The release of lease `key` (ours by `token`) as commands added to `pipe` (one EVAL,
    /// answering 1 or 0): sent behind a fill's write-back, in the same round trip.
    pub(crate) fn release_in(&self, pipe: &mut redis::Pipeline, key: &str, token: &str) {
        pipe.cmd("EVAL")
            .arg(RELEASE_LUA)
            .arg(2)
            .arg(key)
            .arg(waiting_mark(key))
            .arg(token)
            .arg(&self.channel);
    }

    pub(crate) async fn release(&self, pools: &Pools, key: &str, token: &str) {
        let Ok(Some(mut conn)) = pools.redis_async().await else {
            return;
        };
        let done = RELEASE
            .key(key)
            .key(waiting_mark(key))
            .arg(token)
            .arg(&self.channel)
            .invoke_async::<i64>(&mut conn)
            .await;
        if let Err(e) = done {
            pools.drop_redis_async();
            tracing::debug!(error = %e, "fill lease not released: it expires");
        }
    }

    pub(super) fn wake(&self, key: &str) {
        if let Some(tx) = self.waiting().remove(key) {
            tx.send_replace(true);
        }
    }

    /// The subscriber: one connection of its own, reconnecting after failures, until the
    /// leases go.
    pub(crate) fn spawn_listener(
        self: &Arc<Self>,
        background: &crate::background::Background,
        clients: Vec<redis::Client>,
    ) {
        if !self.enabled {
            return;
        }
        let leases = Arc::downgrade(self);
        let channel = self.channel.clone();
        background.spawn(
            "ferry-fill-wakes",
            "waiters on another sidecar's fill wake only at their deadline",
            move |stop| super::fill_wakes::listen(leases, &clients, &channel, &stop),
        );
    }
}

impl Waiter {
    /// Waits for the holder's fill, at most `most`: woken by its release, or, about once a
    /// second, finding the lease gone (its holder died and the lease lapsed). True when woken
    /// (or the fill was done before the wait began).
    pub(crate) async fn wait(mut self, pools: &Pools, most: Duration) -> bool {
        let until = tokio::time::Instant::now() + most;
        if !self.mark(pools, most).await {
            return true;
        }
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let step = left.min(Duration::from_secs(1));
            let Some(rx) = self.rx.as_mut() else {
                return false;
            };
            if tokio::time::timeout(step, rx.wait_for(|v| *v))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                return true;
            }
            if !self.leases.held(pools, &self.key).await {
                return false;
            }
        }
    }
}

impl Waiter {
    /// Marks the lease as waited on (for as long as this wait can last) and says whether it
    /// is still held, in one message. Redis unavailable: taken as held (the wait then ends by
    /// the check once a second, or its patience).
    async fn mark(&self, pools: &Pools, most: Duration) -> bool {
        let Ok(Some(mut conn)) = pools.redis_async().await else {
            return true;
        };
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(waiting_mark(&self.key))
            .arg(1)
            .arg("PX")
            .arg((most + LEASE).as_millis() as u64)
            .ignore()
            .cmd("EXISTS")
            .arg(&self.key);
        match pipe.query_async::<(i64,)>(&mut conn).await {
            Ok((held,)) => held == 1,
            Err(e) => {
                pools.drop_redis_async();
                tracing::debug!(error = %e, "fill lease not marked: redis failed");
                true
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // The last waiter (or a holder, who registered before it knew) leaves no registration.
        // Its own receiver goes first, then the registration is looked at under the lock: so
        // of waiters dropped at once on two threads the last always sees none left (counting
        // itself, each could see the other and both leave it), and one whose registration was
        // woken and replaced leaves the newer one, which has a receiver, to its waiters.
        drop(self.rx.take());
        let mut waiting = self.leases.waiting();
        if waiting
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            waiting.remove(&self.key);
        }
    }
}

#[cfg(test)]
#[path = "leases_tests.rs"]
mod tests;

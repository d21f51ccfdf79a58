//! A fill that other sidecars share (`store::coordination::leases`): the local single flight's leader
//! takes the read's lease and fills, or waits for the sidecar that holds it and answers from
//! the entry it wrote. Whatever the wait gives, the answer is as fresh as a fill of our own:
//! the entry found after it is checked against the current versions like any other, and when
//! it is missing (the holder failed, its rows were too large, or a write moved a version) this
//! sidecar runs the query itself, with the versions it observed before waiting.

use crate::error::ApiError;
use crate::read::flight::Fetched;
use crate::read::lookup::{lookup_many, lookup_with, Reads};
use crate::read::plan::ReadPlan;
use crate::store::cache::{Lookup, Probe};
use crate::store::coordination::leases::{Attempt, Held, Lease};
use crate::store::coordination::nonces::NonceCheck;
use crate::store::pools::send::{send, How};
use ferry_shared::api::CacheMode;
use std::future::Future;
use std::pin::Pin;

pub(crate) type Fill = Pin<Box<dyn Future<Output = Result<Fetched, ApiError>>>>;

/// `work` (a fill of `plan`) behind the read's lease. Behind the lease, the entry is looked up
/// again: another sidecar may have filled it (and let its lease go) since this read looked,
/// and then nothing runs. The second lookup must run after the lease's `SET`: run first, it
/// can miss a fill that lands in between (a refresh ran twice in
/// `single_flight_across_sidecars.rs` when the two were sent apart and unordered). On a single
/// Redis both go in one message on one connection, which Redis runs in order (one round trip);
/// on a cluster the lookup waits for the lease's answer.
///
/// `early`: the lease was tried in the read's first lookup already, which missed behind it
/// (`lookup_one`, a read guessed to miss): it is used as it is, and nothing is looked up again.
pub(crate) fn leased(
    state: &Reads,
    plan: &ReadPlan,
    (identity, early): (String, Option<Early>),
    work: impl FnOnce(Option<Held>) -> Fill + 'static,
) -> impl FnOnce() -> Fill + 'static {
    let (s, plan) = (state.clone(), plan.clone());
    move || {
        Box::pin(async move {
            if !s.leases.enabled() {
                return work(None).await;
            }
            let until = tokio::time::Instant::now() + s.blocking.timeout() / 2;
            let mut tried = match early {
                Some(early) => (early.take(), None),
                None => lease_then_lookup(&s, &plan, &identity).await,
            };
            let mut again = true;
            loop {
                match tried {
                    (Lease::Held { key, token }, None) => {
                        return fill_held(&s, key, token, work).await
                    }
                    (Lease::Held { key, token }, Some(fetched)) => {
                        release_later(&s, key, token);
                        return Ok(fetched);
                    }
                    (_, Some(fetched)) => return Ok(fetched),
                    (Lease::Taken(waiter), None) => {
                        let left = until.saturating_duration_since(tokio::time::Instant::now());
                        let woken = waiter.wait(&s.pools, left).await;
                        crate::metrics::global().fill_wait(woken);
                        if let Some(fetched) = fresh(&s, &plan).await {
                            return Ok(fetched);
                        }
                        // The holder did not fill: its read hit or was refused (a lease taken
                        // early), or its query failed. The lease once more, so that the reads
                        // woken with this one still run the query once between them.
                        if !std::mem::take(&mut again) {
                            return work(None).await;
                        }
                        tried = lease_then_lookup(&s, &plan, &identity).await;
                    }
                    (Lease::Unavailable, None) => return work(None).await,
                }
            }
        })
    }
}

/// The fill, under the lease this sidecar holds (renewed while the query runs).
async fn fill_held(
    s: &Reads,
    key: String,
    token: String,
    work: impl FnOnce(Option<Held>) -> Fill,
) -> Result<Fetched, crate::error::ApiError> {
    let renew = Box::pin(s.leases.renew(&s.pools, &key, &token));
    let held = Held {
        key: key.clone(),
        token: token.clone(),
        leases: s.leases.clone(),
    };
    let out = match futures_util::future::select(work(Some(held)), renew).await {
        futures_util::future::Either::Left((out, _)) => out,
        futures_util::future::Either::Right(((), fill)) => fill.await,
    };
    // Released behind the write-back already: nothing left to send.
    if !matches!(&out, Ok(f) if f.released) {
        release_later(s, key, token);
    }
    out
}

/// Not released with the write-back (no write-back, a cluster, the pooled path, the entry
/// found behind the lease): the answer does not wait for the release, since what it answers is
/// already in Redis (or was not to be stored), and the release only wakes other sidecars'
/// waiters, which it still does after the write-back.
fn release_later(s: &Reads, key: String, token: String) {
    let s = s.clone();
    actix_web::rt::spawn(async move {
        s.leases.release(&s.pools, &key, &token).await;
    });
}

/// One read's lookup, with the request's shared replay check in front of it when given: one
/// message to Redis for both. The check's verdict comes first; None when it was not sent (the
/// cache is not usable now) or its pipeline failed, and `store::coordination::nonces::settle`
/// then runs it on its own.
///
/// A read guessed to miss (this sidecar has not lately seen its entry: `Cache::likely_present`)
/// takes its fill lease in the same message, in front of the lookup, which then counts as
/// the lookup behind the lease (`shared_flight::leased`): a miss spends one round trip on
/// Redis before Postgres instead of two. The lease comes back with the lookup ([`Early`]); a
/// read that does not fill releases it when it drops it.
pub(crate) async fn lookup_one(
    state: &Reads,
    plan: &ReadPlan,
    check: Option<&NonceCheck>,
) -> (
    Option<Result<(), ApiError>>,
    Result<(Option<Lookup>, Option<Early>), ApiError>,
) {
    let attempt = early_attempt(state, plan).await;
    let (verdict, reply, found) = lookup_with(state, &[plan], (check, attempt.as_ref())).await;
    let early = match (attempt, reply) {
        (Some(a), Some(reply)) => Some(Early::new(a.settle(Some(reply)), state)),
        _ => None,
    };
    (verdict, found.map(|mut f| (f.pop().flatten(), early)))
}

/// The lease a read guessed to miss takes in its lookup, or None: the read does not fill
/// through a shared lease (no cache plan, no-cache or only-if-cached, leases off), or the
/// lease could not go in front of its lookup in order (a cluster; Redis failing: see
/// `Cache::lookup_behind`), or its entry was lately seen, or this worker has no Redis
/// connection of its own.
async fn early_attempt(state: &Reads, plan: &ReadPlan) -> Option<Attempt> {
    let c = plan.cache.as_ref()?;
    if matches!(c.mode, CacheMode::NoCache | CacheMode::OnlyIfCached)
        || state.pools.redis_cluster()
        || !state.pools.redis_breaker_closed()
    {
        return None;
    }
    let probe = Probe {
        key: &c.key,
        fingerprint: &c.fingerprint,
        tags: &c.tags,
    };
    if state.cache.likely_present(&probe) {
        return None;
    }
    // Released, when not taken, on this worker's own connection: never through the blocking
    // pool, whose admission could refuse it under load (the lease would then lapse, 2 s).
    if !matches!(state.pools.redis_async().await, Ok(Some(_))) {
        return None;
    }
    state.leases.attempt(&c.flight_identity())
}

/// A fill lease tried in a read's first lookup ([`lookup_one`]), before it was known whether
/// the read would miss. A fill takes it ([`Early::take`], in [`leased`]); dropped untaken (the
/// read hit, was a replay, or bypassed the cache), a lease it holds is released at once, so
/// another sidecar's miss does not wait on it. (A read holding it never joins a fill already
/// running here: `flight::Join::Never`.)
pub(crate) struct Early {
    lease: Option<Lease>,
    state: Reads,
}

impl Early {
    pub(crate) fn new(lease: Lease, state: &Reads) -> Early {
        Early {
            lease: Some(lease),
            state: state.clone(),
        }
    }

    /// Whether it holds the lease (the read must then fill: `flight::Join::Never`).
    pub(crate) fn holds(early: &Option<Early>) -> bool {
        matches!(
            early,
            Some(Early {
                lease: Some(Lease::Held { .. }),
                ..
            })
        )
    }

    fn take(mut self) -> Lease {
        self.lease.take().unwrap_or(Lease::Unavailable)
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        let Some(Lease::Held { key, token }) = self.lease.take() else {
            return;
        };
        // Dropped on a worker's event loop (a request's task, or a fill's), never elsewhere.
        let s = self.state.clone();
        actix_web::rt::spawn(async move {
            let mut pipe = redis::pipe();
            s.leases.release_in(&mut pipe, &key, &token);
            // Released again on a connection Redis ended: it deletes only our own token.
            let how = How {
                each: false,
                again: true,
            };
            if !matches!(send(&s.pools, &s.blocking, &pipe, how).await, Ok(Ok(_))) {
                tracing::debug!("early fill lease not released: it expires");
            }
        });
    }
}

/// The read's lease tried, then its entry looked up (see [`leased`]).
async fn lease_then_lookup(s: &Reads, plan: &ReadPlan, identity: &str) -> (Lease, Option<Fetched>) {
    let Some(attempt) = s.leases.attempt(identity) else {
        return (Lease::Unavailable, fresh(s, plan).await);
    };
    if let Some(c) = &plan.cache {
        let probe = Probe {
            key: &c.key,
            fingerprint: &c.fingerprint,
            tags: &c.tags,
        };
        if let Some((reply, found)) = s
            .cache
            .lookup_behind(&s.pools, &s.blocking, &probe, &attempt)
            .await
        {
            return (attempt.settle(reply), hit(plan, found));
        }
    }
    let lease = attempt.send(&s.pools).await;
    (lease, fresh(s, plan).await)
}

/// The read's entry, when it is a fresh hit now (checked against the current versions).
async fn fresh(s: &Reads, plan: &ReadPlan) -> Option<Fetched> {
    hit(plan, lookup_many(s, &[plan]).await.ok()?.pop()??)
}

/// A hit for this read: fresh by the current versions, and no older than its own TTL.
fn hit(plan: &ReadPlan, found: Lookup) -> Option<Fetched> {
    let found = match &plan.cache {
        Some(c) => found.within(&c.entry),
        None => found,
    };
    match found {
        Lookup::Hit { rows, age_ms, .. } => Some(Fetched {
            rows,
            too_large: false,
            released: false,
            landed: None,
            cached_age_ms: Some(age_ms),
        }),
        _ => None,
    }
}

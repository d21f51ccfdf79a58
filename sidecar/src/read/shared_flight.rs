//! A fill that other sidecars share (`store::coordination::leases`): the local single flight's leader
//! takes the read's lease and fills, or waits for the sidecar that holds it and answers from
//! the entry it wrote. Whatever the wait gives, the answer is as fresh as a fill of our own:
//! the entry found after it is checked against the current versions like any other, and when
//! it is missing (the holder failed, its rows were too large, or a write moved a version) this
//! sidecar runs the query itself, with the versions it observed before waiting.

use crate::error::ApiError;
use crate::read::flight::Fetched;
use crate::read::lookup::{lookup_many, Reads};
use crate::read::plan::ReadPlan;
use crate::store::cache::{Lookup, Probe};
use crate::store::coordination::leases::{Held, Lease};
use crate::store::pools::send::{send, How};
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
/// (`read::lookup`, a read guessed to miss): it is used as it is, and nothing is looked up again.
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
            let deadline = s.blocking.timeout();
            let (lease, found) = match early {
                Some(early) => (early.take(), None),
                None => lease_then_lookup(&s, &plan, &identity).await,
            };
            match (lease, found) {
                (Lease::Held { key, token }, found) => {
                    let out = match found {
                        Some(fetched) => Ok(fetched),
                        None => {
                            let renew = Box::pin(s.leases.renew(&s.pools, &key, &token));
                            let held = Held {
                                key: key.clone(),
                                token: token.clone(),
                                leases: s.leases.clone(),
                            };
                            match futures_util::future::select(work(Some(held)), renew).await {
                                futures_util::future::Either::Left((out, _)) => out,
                                futures_util::future::Either::Right(((), fill)) => fill.await,
                            }
                        }
                    };
                    // Released behind the write-back already: nothing left to send.
                    if matches!(&out, Ok(f) if f.released) {
                        return out;
                    }
                    // Not released with the write-back (no write-back, a cluster, the pooled
                    // path): the answer does not wait for the release, since what it answers
                    // is already in Redis (or was not to be stored), and the release only
                    // wakes other sidecars' waiters, which it still does after the write-back.
                    let s = s.clone();
                    actix_web::rt::spawn(async move {
                        s.leases.release(&s.pools, &key, &token).await;
                    });
                    out
                }
                (_, Some(fetched)) => Ok(fetched),
                (Lease::Taken(waiter), None) => {
                    let woken = waiter.wait(&s.pools, deadline / 2).await;
                    crate::metrics::global().fill_wait(woken);
                    match fresh(&s, &plan).await {
                        Some(fetched) => Ok(fetched),
                        None => work(None).await,
                    }
                }
                (Lease::Unavailable, None) => work(None).await,
            }
        })
    }
}

/// A fill lease tried in a read's first lookup (`read::lookup`), before it was known whether
/// the read would miss. A fill takes it ([`Early::take`], in [`leased`]); dropped untaken (the
/// read hit, was a replay, bypassed the cache, or joined a fill already running here), a lease
/// it holds is released at once, so another sidecar's miss does not wait on it.
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

//! A fill that other sidecars share (`store::leases`): the local single flight's leader
//! takes the read's lease and fills, or waits for the sidecar that holds it and answers from
//! the entry it wrote. Whatever the wait gives, the answer is as fresh as a fill of our own:
//! the entry found after it is checked against the current versions like any other, and when
//! it is missing (the holder failed, its rows were too large, or a write moved a version) this
//! sidecar runs the query itself, with the versions it observed before waiting.

use crate::http::error::ApiError;
use crate::read::engine::{lookup_many, Reads};
use crate::read::flight::Fetched;
use crate::read::plan::ReadPlan;
use crate::store::cache::Lookup;
use crate::store::leases::Lease;
use std::future::Future;
use std::pin::Pin;

pub type Fill = Pin<Box<dyn Future<Output = Result<Fetched, ApiError>>>>;

/// `work` (a fill of `plan`) behind the read's lease.
pub fn leased(
    state: &Reads,
    plan: &ReadPlan,
    identity: String,
    work: impl FnOnce() -> Fill + 'static,
) -> impl FnOnce() -> Fill + 'static {
    let (s, plan) = (state.clone(), plan.clone());
    move || {
        Box::pin(async move {
            let deadline = s.blocking.timeout();
            match s.leases.acquire(&s.pools, &identity).await {
                Lease::Held { key, token } => {
                    let renew = Box::pin(s.leases.renew(&s.pools, &key, &token));
                    let out = match futures_util::future::select(work(), renew).await {
                        futures_util::future::Either::Left((out, _)) => out,
                        futures_util::future::Either::Right(((), fill)) => fill.await,
                    };
                    s.leases.release(&s.pools, &key, &token).await;
                    out
                }
                Lease::Taken(waiter) => {
                    let woken = waiter.wait(&s.pools, deadline / 2).await;
                    crate::http::metrics::global().fill_wait(woken);
                    if let Ok(mut found) = lookup_many(&s, &[&plan]).await {
                        if let Some(Some(Lookup::Hit { rows, .. })) = found.pop() {
                            return Ok(Fetched {
                                rows,
                                too_large: false,
                            });
                        }
                    }
                    work().await
                }
                Lease::Unavailable => work().await,
            }
        })
    }
}

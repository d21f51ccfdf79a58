//! What the engine works with ([`Reads`]), and lookups: many reads' entries in one Redis
//! round trip (`store::pools::send` chooses the connection).

use crate::error::ApiError;
use crate::read::flight::Flights;
use crate::read::plan::{CachePlan, ReadPlan};
use crate::read::shared_flight::Early;
use crate::store::blocking::Blocking;
use crate::store::cache::{Cache, Lookup, Probe};
use crate::store::coordination::leases::Attempt;
use crate::store::coordination::nonces::NonceCheck;
use crate::store::pools::Pools;
use ferry_shared::api::CacheMode;
use std::sync::Arc;

/// What the engine works with: the pools, the cache, the single flights and the rule for
/// blocking work. Cheap to clone (shared handles).
#[derive(Clone)]
pub(crate) struct Reads {
    pub pools: Arc<Pools>,
    pub cache: Arc<Cache>,
    pub flights: Arc<Flights>,
    pub blocking: Blocking,
    /// Single flight across sidecars (`read::shared_flight`).
    pub leases: Arc<crate::store::coordination::leases::Leases>,
    /// Streaming replicas, for reads that skip the cache (`store::replicas`).
    pub replicas: Arc<crate::store::replicas::Replicas>,
}

type State = Reads;

/// Looks many reads up in one Redis pipeline (reads without a cache plan get `None`).
pub(crate) async fn lookup_many(
    state: &State,
    plans: &[&ReadPlan],
) -> Result<Vec<Option<Lookup>>, ApiError> {
    lookup_with(state, plans, (None, None)).await.2
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
    state: &State,
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
async fn early_attempt(state: &State, plan: &ReadPlan) -> Option<Attempt> {
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

/// The lookup of `plans`, behind a replay check and a fill lease when given (see
/// `Cache::lookup_many`): the check's verdict, the lease's reply, each read's entry.
async fn lookup_with(
    state: &State,
    plans: &[&ReadPlan],
    front: (Option<&NonceCheck>, Option<&Attempt>),
) -> (
    Option<Result<(), ApiError>>,
    Option<redis::Value>,
    Result<Vec<Option<Lookup>>, ApiError>,
) {
    let probes: Vec<(usize, CachePlan)> = plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.cache.clone().map(|c| (i, c)))
        .collect();
    let n = plans.len();
    if probes.is_empty() {
        return (None, None, Ok((0..n).map(|_| None).collect()));
    }
    let list = probe_list(&probes);
    let found = state
        .cache
        .lookup_many(&state.pools, &state.blocking, &list, front)
        .await;
    match found {
        Ok((verdict, reply, found)) => (verdict, reply, Ok(place(n, &probes, found))),
        Err(e) => (None, None, Err(e)),
    }
}

/// Each lookup back at its read's position (reads without a cache plan get None).
fn place(n: usize, probes: &[(usize, CachePlan)], found: Vec<Lookup>) -> Vec<Option<Lookup>> {
    let mut out: Vec<Option<Lookup>> = (0..n).map(|_| None).collect();
    for ((i, _), l) in probes.iter().zip(found) {
        out[*i] = Some(l);
    }
    out
}

fn probe_list(probes: &[(usize, CachePlan)]) -> Vec<Probe<'_>> {
    probes
        .iter()
        .map(|(_, c)| Probe {
            key: &c.key,
            fingerprint: &c.fingerprint,
            tags: &c.tags,
        })
        .collect()
}

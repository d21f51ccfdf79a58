//! What the engine works with ([`Reads`]), and lookups: many reads' entries in one Redis
//! round trip (`store::pools::send` chooses the connection).

use crate::error::ApiError;
use crate::read::flight::Flights;
use crate::read::plan::{CachePlan, ReadPlan};
use crate::store::blocking::Blocking;
use crate::store::cache::{Cache, Lookup, Probe};
use crate::store::coordination::leases::Attempt;
use crate::store::coordination::nonces::NonceCheck;
use crate::store::pools::Pools;
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

/// The lookup of `plans`, behind a replay check and a fill lease when given (see
/// `Cache::lookup_many`): the check's verdict, the lease's reply, each read's entry.
pub(crate) async fn lookup_with(
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

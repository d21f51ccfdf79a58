//! The write epilogue, in one place: what every committed write does before it is answered
//! (`/v1/execute`, `/v1/transaction`, an interactive commit, and an outcome found committed).
//!
//! Only after the commit: invalidating first would let a read refill the old value. Flights
//! are forgotten first, so no later read joins a query that began before the write; then the
//! entries are invalidated (or the invalidation deferred, never dropped); then the write's
//! position is taken, for reads that must see it on a replica.

use crate::state::AppState;
use ferry_shared::api::{InvalidationStatus, Position};

/// What a committed write answers with, besides its own result.
pub(crate) struct Committed {
    pub invalidation: InvalidationStatus,
    pub position: Option<Position>,
}

/// Runs the epilogue of a write that committed (blocking: call it inside `Blocking::run`).
pub(crate) fn committed(state: &AppState, keys: &[String], tags: &[String]) -> Committed {
    state.flights.forget(keys, tags);
    let invalidation = state.cache.invalidate(&state.pools, keys, tags);
    Committed {
        invalidation,
        position: state.replicas.position_after_write(&state.pools),
    }
}

/// The answer of a write that did not commit: nothing to invalidate, no position.
pub(crate) fn not_committed() -> Committed {
    Committed {
        invalidation: InvalidationStatus::None,
        position: None,
    }
}

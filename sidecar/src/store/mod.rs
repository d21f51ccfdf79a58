//! The stores, by store and by concept. Nothing here knows HTTP: failures are
//! `crate::error::ApiError`, which `http/error.rs` turns into responses.
//!
//! Imports run one way, bottom to top: [`postgres`] and [`redis`] (connections) → [`pools`]
//! (and `blocking`) → [`statements`], [`coordination`], [`cache`], `replicas`, `readiness`.
//!
//! - [`postgres`]: connections: the connection settings, each worker's event-loop sessions,
//!   the proof that sessions are Ferry's own, the role check, a statement run as an end user,
//!   the parameter types Postgres gave, deadlines that cancel, and Postgres failures as
//!   callers see them.
//! - [`redis`]: one server or a cluster: clients, pooled and multiplexed connections.
//! - [`pools`]: the bounded Redis and Postgres pools and the Redis circuit breaker; a pooled
//!   session's checkout and reset; a Redis connection lost. `blocking`: `Blocking::run`, the
//!   only way handlers do blocking work; `readiness`: the background probe.
//! - [`statements`]: what runs on those sessions: the statement's class (what may run at all),
//!   reads and writes on a pooled session and plain reads on the worker's event loop,
//!   transactions (one call and interactive), values both ways (JSON, text).
//! - [`cache`]: the read-through layout, versions, invalidation, and plain cache commands.
//! - [`coordination`]: what sidecars agree on through the stores: replay checks (nonces) and
//!   write outcomes, single-flight leases, per-user rate limits, Ferry's own tables.
//! - `replicas`: streaming replicas for plain reads, and the positions that give
//!   read-your-writes.

pub(crate) mod blocking;
pub(crate) mod cache;
pub(crate) mod coordination;
pub(crate) mod pools;
pub(crate) mod postgres;
pub(crate) mod readiness;
pub(crate) mod redis;
pub(crate) mod replicas;
pub(crate) mod statements;

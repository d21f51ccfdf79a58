//! The stores. `pools`: the bounded Redis and Postgres pools and the Redis circuit breaker;
//! `blocking`: `Blocking::run`, the only way handlers do blocking work; `deadline`: its
//! deadline cancels the statements a job is running. Postgres: `postgres`
//! (sessions, connection settings, the role check), `db` (reads, writes, the reset after each
//! request), `failure` (Postgres errors as the caller sees them), `pg_async` and `db_async` (plain reads on the worker's event loop), `identity` (a statement run as
//! an end user's role and claims), `rate_limit` (each end user's request rate, in Redis), `nonces` (replay protection shared
//! by every sidecar, in Redis and Postgres), `write_outcome` (did a write commit? its nonce row says, or is
//! fenced), `leases` (single flight across sidecars), `param_types` (what Postgres said about each statement's parameters), `statement`
//! (what may run at all), `pg_json` and `pg_params` (values both ways).
//! Redis: `redis` (one server or a cluster: clients, pooled and multiplexed connections), `cache` (the read-through layout, versions and
//! invalidation), `commands` (plain cache commands). `readiness`: the background probe. `replicas`: streaming replicas for plain reads, and
//! the positions that give read-your-writes.

pub mod blocking;
pub mod cache;
pub mod commands;
pub mod db;
pub mod db_async;
pub mod deadline;
pub mod failure;
pub mod ferry_tables;
pub mod identity;
pub mod interactive;
pub mod leases;
pub mod nonces;
pub mod own_sessions;
pub mod param_types;
pub mod pg_async;
pub mod pg_json;
pub mod pg_params;
pub mod pg_text;
pub mod pools;
pub mod postgres;
pub mod rate_limit;
pub mod readiness;
pub mod redis;
pub mod replicas;
pub mod roles;
pub mod session;
pub mod statement;
pub mod transaction;
pub mod write_outcome;

//! The read engine. `plan` turns a request into what will run (all validation, before any
//! I/O; `identity` the end user it runs as; `invalidation` what a write will drop). `lookup`
//! looks reads up in one pipeline; `engine` answers each: hit, stale-while-revalidate, a fill from
//! Postgres through `flight` (single-flight; across sidecars with `shared_flight`), or
//! stale-if-error. `many` answers many reads together (`/v1/batch`, and `keyed`: rows of a
//! keyspace by id, as reads of its statement); `grouped` answers a batch's misses of one
//! statement with a batch form as one statement. `postgres` runs what Postgres answers;
//! `replica_read` sends a read that skips the cache to a streaming replica that may serve it.
//! `inferred`: whether a read can be cached and stay fresh, on which tables, as Postgres's own
//! parse of it says; `inferred_report` says it in words (`--explain-cache`, `--check-config`).

pub(crate) mod engine;
pub(crate) mod flight;
pub(crate) mod grouped;
pub(crate) mod identity;
pub(crate) mod inferred;
pub(crate) mod inferred_report;
pub(crate) mod invalidation;
pub(crate) mod keyed;
pub(crate) mod lookup;
pub(crate) mod many;
pub(crate) mod plan;
mod postgres;
pub(crate) mod replica_read;
pub(crate) mod shared_flight;
pub(crate) mod text_plan;

pub(crate) use engine::answer;
pub(crate) use lookup::Reads;
pub(crate) use shared_flight::lookup_one;

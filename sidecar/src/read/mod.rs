//! The read engine. `plan` turns a request into what will run (all validation, before any
//! I/O; `identity` the end user it runs as; `invalidation` what a write will drop). `lookup`
//! looks reads up in one pipeline; `engine` answers each: hit, stale-while-revalidate, a fill from
//! Postgres through `flight` (single-flight; across sidecars with `shared_flight`), or
//! stale-if-error. `many` answers many reads together (`/v1/batch`, and `keyed`: rows of a
//! keyspace by id, as reads of its statement); `grouped` answers a batch's misses of one
//! statement with a batch form as one statement. `postgres` runs what Postgres answers;
//! `replica_read` sends a read that skips the cache to a streaming replica that may serve it.

pub mod engine;
pub mod flight;
pub mod grouped;
pub mod identity;
pub mod invalidation;
pub mod keyed;
pub mod lookup;
pub mod many;
pub mod plan;
mod postgres;
pub mod replica_read;
pub mod shared_flight;
pub mod text_plan;

pub use engine::answer;
pub use lookup::{lookup_many, lookup_many_checked, Reads};

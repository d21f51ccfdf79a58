//! The Ferry edge library: what a Worker uses to read and write through the Ferry sidecar
//! without ever opening a Redis or Postgres connection itself. One [`Ferry`] per request
//! ([`ferry`]: reads, writes, transactions, keyed reads, cache commands, automatic batching,
//! read-your-writes), built from the Worker's bindings ([`config`]); [`client`] signs every
//! call; [`EdgeError`] is every failure, with its status and JSON body; [`access`] the API key
//! and end users' tokens; [`outcome`] settles a write whose answer was lost.
//!
//! Pure logic is tested natively; only the wasm32 build pulls in the `worker` crate. The demo
//! Worker that `scripts/dev.sh` runs is a separate crate built on this one (`edge/demo`).

// A panic kills the isolate: unwrap/expect are denied outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod access;
pub mod client;
pub mod config;
pub mod error;
pub mod ferry;
pub use ferry_shared::{jwks, jwt};
pub mod outcome;

pub use error::EdgeError;
#[cfg(target_arch = "wasm32")]
pub use ferry::end_user;
pub use ferry::Ferry;

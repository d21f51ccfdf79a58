//! What crosses the wire between the Ferry edge (wasm Worker) and the Ferry sidecar, and nothing
//! else.
//!
//! - [`api`]: request and response bodies of the `/v1` endpoints.
//! - [`error`]: the JSON error body every failure is answered with, and its stable codes.
//! - [`sign`]: HMAC-SHA256 request signing and verification (both sides use this code).
//! - [`jwt`], [`jwks`]: end users' tokens, checked the same way at the edge and at the sidecar
//!   (the edge for its routes, the sidecar for the Neon driver's `authToken`).
//!
//! This crate has no runtime dependencies beyond serde and the RustCrypto hashes, so it builds
//! for `wasm32-unknown-unknown` and for the host alike. Wire changes are additive within `/v1`.

// A panic is an outage here (a dead request, or on the edge a dead isolate).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod cache;
pub mod error;
pub mod identity;
pub mod jwks;
pub mod jwt;
pub mod position;
pub mod sign;
pub mod token;
pub mod transaction;

pub use error::{ErrorBody, ErrorCode};

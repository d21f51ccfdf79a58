//! What every sidecar agrees on through the shared stores. `nonces`: replay protection across
//! sidecars (Redis, and Postgres's nonce table), and `nonces::outcome`: did a write commit? (its
//! nonce row says, or is fenced); `leases`: single flight across sidecars; `rate_limit`: each end
//! user's request rate; `ferry_tables`: Ferry's own tables in Postgres; `fill_wakes`: the
//! subscriber that wakes waiters on another sidecar's fill.

pub(crate) mod ferry_tables;
mod fill_wakes;
pub(crate) mod leases;
pub(crate) mod nonces;
pub(crate) mod rate_limit;

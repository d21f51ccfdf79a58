//! The HTTP concerns around the routes: authentication (signatures, then the replay store),
//! JSON bodies, request ids, TLS, metrics, and `error`, the one place failures become HTTP.

pub mod auth;
pub mod end_user;
pub mod error;
pub mod json;
pub mod json_out;
pub mod metrics;
pub mod replay;
pub mod request_id;
pub mod tls;

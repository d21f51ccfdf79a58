//! The HTTP concerns around the routes: authentication (signatures, then the replay store),
//! JSON bodies, request ids, the access middleware (`access`: each request into the metrics and
//! the access log), and `error`, the one place failures become HTTP.

pub mod access;
pub mod auth;
pub mod end_user;
pub mod error;
pub mod json;
pub mod json_out;
pub mod replay;
pub mod request_id;

//! The HTTP concerns around the routes: authentication (signatures, then the replay store),
//! JSON bodies, request ids, the access middleware (`access`: each request into the metrics and
//! the access log), and `error`, the one place failures become HTTP.

pub(crate) mod access;
pub(crate) mod auth;
pub(crate) mod end_user;
pub(crate) mod error;
pub(crate) mod json;
pub(crate) mod json_out;
pub(crate) mod replay;
pub(crate) mod request_id;

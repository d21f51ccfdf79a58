//! [`Identity`]: the end user a request runs as (re-exported from `api`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The end user a statement runs as, as the edge verified them (a JWT's claims, say). The
/// sidecar runs the statement as `role` with `claims` as JSON in a setting
/// (`request.jwt.claims` by default, as PostgREST does), so Postgres row-level security applies;
/// a cached result is only ever served to the same role and claims. It travels inside the
/// signed body: only a holder of the edge secret can name an identity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// A Postgres role from the sidecar's `identity.roles` (`"authenticated"`, `"anon"`).
    pub role: String,
    /// The verified claims (`{"sub": "user-42", ...}`), readable in SQL as
    /// `current_setting('request.jwt.claims', true)::json`.
    #[serde(default)]
    pub claims: Map<String, Value>,
}

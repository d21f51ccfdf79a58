//! Running a statement as an end user: the session takes on the request's role and claims
//! before the statement, so Postgres row-level security sees that user.
//!
//! Both are set for the session (not `LOCAL`): every request has its session to itself, and the
//! reset after it (`DISCARD ALL`, which puts the role back to the login role and clears every
//! setting) runs before the session serves anyone else, or else the session is closed. So the
//! statement keeps the fast path that a transaction block would lose (see `db::run`).

use crate::store::postgres::failure::Failure;
use postgres_types::Type;

/// One round trip, no statement prepared: `set_config('role', ...)` is `SET ROLE`, checked by
/// Postgres (the login role must be a member of the role). The third column says whether the
/// role would skip row-level security (a superuser, or BYPASSRLS): such a role is refused on
/// every request, whatever the config says.
const ASSUME: &str = "SELECT set_config('role', $1, false), set_config($2, $3, false), \
                      (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = $1)";

/// Who a statement runs as: a role the config allows, and the claims as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionIdentity {
    pub role: String,
    /// The claims as JSON (keys sorted: one user's claims always serialize the same way).
    pub claims: String,
    /// The setting that holds them (`identity.claims_setting`).
    pub setting: String,
    /// Who the end user is, for their rate limit: the role and the `sub` claim (or the whole
    /// claims when there is no `sub`).
    pub user: String,
}

impl SessionIdentity {
    /// The cache scope of reads run as this identity: their entries and single flights are
    /// never shared with another role or other claims.
    pub(crate) fn scope(&self) -> [&str; 3] {
        ["as", &self.role, &self.claims]
    }

    fn params(&self) -> [(&(dyn postgres_types::ToSql + Sync), Type); 3] {
        [
            (&self.role, Type::TEXT),
            (&self.setting, Type::TEXT),
            (&self.claims, Type::TEXT),
        ]
    }

    /// On a pooled (blocking) session.
    pub(in crate::store) fn assume(&self, client: &mut postgres::Client) -> Result<(), Failure> {
        let rows = client
            .query_typed(ASSUME, &self.params())
            .map_err(|e| self.failed(e))?;
        self.applies_rls(&rows)
    }

    /// On a worker's own session.
    pub(in crate::store) async fn assume_async(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<(), Failure> {
        let rows = client
            .query_typed(ASSUME, &self.params())
            .await
            .map_err(|e| self.failed(e))?;
        self.applies_rls(&rows)
    }

    fn applies_rls(&self, rows: &[tokio_postgres::Row]) -> Result<(), Failure> {
        let bypasses = rows
            .first()
            .and_then(|r| r.try_get::<_, Option<bool>>(2).ok())
            .flatten();
        match bypasses {
            Some(false) => Ok(()),
            _ => Err(Failure::Api(crate::error::ApiError::internal(format!(
                "identity role {:?} is a superuser or has BYPASSRLS: row-level security would \
                 not apply, so it is refused",
                self.role
            )))),
        }
    }

    /// A role the config allows that Postgres refuses (missing, or not granted to the login
    /// role) is the deployment's fault, not the caller's: the detail goes to the log only.
    fn failed(&self, e: postgres::Error) -> Failure {
        match Failure::from(e) {
            Failure::Pg(e) => Failure::Api(crate::error::ApiError::internal(format!(
                "cannot assume identity role {:?}: {e}",
                self.role
            ))),
            other => other,
        }
    }
}

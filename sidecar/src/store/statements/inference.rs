//! A statement's verdict asked on the request path (`read::inferred`): on this worker's own
//! session of the role the read runs as, within the in-flight limit and the request deadline,
//! the session reset after it (the probe made a temporary function, rolled back, and a
//! prepared statement).

use crate::error::ApiError;
use crate::store::blocking::Blocking;
use crate::store::pools::session::RESET;
use crate::store::pools::Pools;
use crate::store::postgres::analysis::{analyse_on_loop, Verdict};
use crate::store::postgres::failure::Failure;

/// What Postgres says `sql` calls and reads, as `role` (a Neon token's `postgres_url`; None:
/// `postgres.url`'s role), and which of its reads the stream of `publication` can key by value.
pub(crate) async fn ask(
    pools: &Pools,
    blocking: &Blocking,
    role: Option<&str>,
    sql: &str,
    publication: &str,
) -> Result<Verdict, ApiError> {
    let _slot = blocking.admit()?;
    let work = async {
        let mut session = pools.pg_session_here(role).await?;
        let Some(client) = session.client.as_ref() else {
            return Err(ApiError::internal("session without a client"));
        };
        let verdict = analyse_on_loop(client, sql, publication).await;
        if verdict.is_ok() && !client.is_closed() && client.batch_execute(RESET).await.is_ok() {
            session.reusable = true;
        }
        verdict.map_err(|e| Failure::from(e).into_api())
    };
    tokio::time::timeout(blocking.timeout(), work)
        .await
        .map_err(|_| ApiError::Timeout {
            what: "the request",
        })?
}

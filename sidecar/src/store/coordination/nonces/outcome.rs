//! A write's outcome, read from its nonce row (see `nonces`): committed, or fenced so that it
//! never will. Asked by `POST /v1/outcome`, and by a sidecar that lost its connection during a
//! write's COMMIT before it answers.

use crate::error::ApiError;
use crate::store::coordination::nonces::WriteNonce;
use crate::store::pools::session::rollback;
use crate::store::pools::session::with_owner_session;
use crate::store::pools::Pools;
use crate::store::postgres::failure::Failure;

/// Whether the write with this nonce committed: Some(rows it affected), or None, in which case
/// it never will (the nonce's row is inserted now, so the write, if still running, fails on it
/// at its COMMIT; a write between its nonce and its COMMIT is waited for). An error: Postgres
/// could not say.
pub(crate) fn outcome(pools: &Pools, nonce: &WriteNonce) -> Result<Option<u64>, ApiError> {
    // As Ferry's own role: the only one that may read and write the books directly.
    with_owner_session(pools, |s| {
        nonce.books.make_sure(s)?;
        let fence = format!(
            "BEGIN READ WRITE; INSERT INTO {} (nonce, expires_at, rows_affected) \
             VALUES (decode('{}', 'hex'), now() + make_interval(secs => {}), NULL) \
             ON CONFLICT (nonce) DO NOTHING; COMMIT",
            nonce.books.table,
            nonce.hex,
            nonce.keep_s()
        );
        let fenced = s.client.simple_query(&fence).map_err(|e| {
            rollback(s);
            Failure::from(e)
        })?;
        let inserted = fenced
            .iter()
            .any(|m| matches!(m, postgres::SimpleQueryMessage::CommandComplete(1)));
        if inserted {
            return Ok(None);
        }
        // A new statement, so a new snapshot: it sees the write that was waited for.
        let row = s
            .client
            .query_one(
                &format!(
                    "SELECT rows_affected FROM {} WHERE nonce = decode($1, 'hex')",
                    nonce.books.table
                ),
                &[&nonce.hex],
            )
            .map_err(Failure::from)?;
        Ok(row.get::<_, Option<i64>>(0).map(|n| n.max(0) as u64))
    })
    .map_err(Failure::into_api)
}

/// [`outcome`], asked again for up to `OUTCOME_PATIENCE`: the fault that cut the write's
/// connection (a restart, a network blip) often cuts the next ones too for a moment.
pub(in crate::store) fn outcome_patiently(
    pools: &Pools,
    nonce: &WriteNonce,
) -> Result<Option<u64>, ApiError> {
    const OUTCOME_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);
    let until = std::time::Instant::now() + OUTCOME_PATIENCE;
    loop {
        match outcome(pools, nonce) {
            Err(e) if std::time::Instant::now() < until => {
                tracing::debug!(error = %e, "write outcome not known yet; asking again");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            answer => return answer,
        }
    }
}

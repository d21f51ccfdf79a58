//! Many reads answered together, in order: `/v1/batch` and the keyed reads of a keyspace
//! (`keyed`) both come through here. Their lookups go to Redis in one round trip, the misses
//! of one statement with a batch form to Postgres as one statement (`grouped`), and the rest
//! run concurrently, each with its single flight, lease and conditional write-back.

use super::engine;
use super::lookup::{lookup_many, Reads};
use super::plan::ReadPlan;
use crate::error::ApiError;
use futures_util::stream::{self, StreamExt};
use std::time::Duration;

/// What bounds a whole batch of reads.
pub(crate) struct Bounds {
    /// Reads running at once (each may hold a pooled Postgres connection).
    pub concurrency: usize,
    /// The bytes of rows the whole answer may carry (`limits.max_batch_bytes`): past it, the
    /// remaining reads are answered result_too_large and their rows dropped, never kept.
    pub max_bytes: usize,
    /// One deadline for the whole batch, not one per read.
    pub deadline: Duration,
}

/// Each of `plans` answered (or its planning error passed on), in order.
pub(crate) async fn read_many(
    state: &Reads,
    plans: Vec<Result<ReadPlan, ApiError>>,
    bounds: Bounds,
) -> Result<Vec<Result<engine::Answer, ApiError>>, ApiError> {
    let timeout = || ApiError::Timeout { what: "the batch" };
    // One deadline for the lookups, the grouped statements and every read together.
    let until = tokio::time::Instant::now() + bounds.deadline;
    let valid: Vec<&ReadPlan> = plans.iter().filter_map(|p| p.as_ref().ok()).collect();
    let lookups = lookup_many(state, &valid).await?;
    // Misses of one statement with a batch form: one statement for all of them.
    let prefetched = tokio::time::timeout_at(
        until,
        super::grouped::prefetch(state, &valid, &lookups, bounds.max_bytes),
    )
    .await
    .map_err(|_| timeout())?;
    let mut found = lookups.into_iter().zip(prefetched);
    let jobs: Vec<_> = plans
        .into_iter()
        .map(|p| {
            let (lookup, rows) = match p {
                Ok(_) => found.next().unwrap_or((None, None)),
                Err(_) => (None, None),
            };
            async move {
                match rows {
                    Some(Err(e)) => Err(e),
                    rows => {
                        engine::answer_prefetched(state, p?, lookup, rows.and_then(Result::ok))
                            .await
                    }
                }
            }
        })
        .collect();
    let max_bytes = bounds.max_bytes;
    let mut used = 0usize;
    let collect = stream::iter(jobs)
        .buffered(bounds.concurrency.max(1))
        .map(|r| match r {
            Ok(resp) => {
                used = used.saturating_add(resp.rows.approx_bytes());
                if used > max_bytes {
                    Err(ApiError::ResultTooLarge {
                        limit: format!("limits.max_batch_bytes ({max_bytes} bytes)"),
                    })
                } else {
                    Ok(resp)
                }
            }
            Err(e) => Err(e),
        });
    tokio::time::timeout_at(until, collect.collect())
        .await
        .map_err(|_| timeout())
}

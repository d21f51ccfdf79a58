//! The read-through engine: lookup, then hit / stale / single-flight fill from Postgres /
//! stale-if-error, per the read's cache plan. Shared by `/v1/query` and `/v1/batch`.

use crate::error::ApiError;
use crate::read::flight::{Fetched, Join, Outcome};
use crate::read::lookup::Reads;
use crate::read::plan::{CachePlan, Infer, ReadFormat, ReadPlan};
use crate::read::postgres::{on_primary, run_query, text_query};
use crate::read::shared_flight::{self, lookup_one, Early, Fill};
use crate::store::cache::{value_key, Lookup, Observed, Rows, Stored};
use crate::store::coordination::leases::Held;
use crate::store::postgres::by_value::key_text;
use crate::store::postgres::top_n::TopN;
use ferry_shared::api::{CacheMode, CacheStatus, QueryResponse, Row, StaleReason};
/// A read's answer: its rows parsed, or as a cache entry's text (`Rows`).
pub(crate) type Answer = QueryResponse<Rows>;

type State = Reads;

/// One read from start to answer.
pub(crate) async fn read(state: &State, plan: ReadPlan) -> Result<Answer, ApiError> {
    let (lookup, early) = lookup_one(state, &plan, None).await.1?;
    answer(state, plan, (lookup, early)).await
}

/// Answers a read whose lookup (if it has a cache plan) is done, with the fill lease taken in
/// it (`lookup_one`), and counts the outcome.
pub(crate) async fn answer(
    state: &State,
    plan: ReadPlan,
    (lookup, early): (Option<Lookup>, Option<Early>),
) -> Result<Answer, ApiError> {
    let r = answer_inner(state, plan, lookup, (None, early)).await;
    count(&r);
    r
}

/// [`answer`], with the rows Postgres already gave for this read (`grouped`): where it would
/// go to Postgres, it takes them instead (its write-back as usual).
pub(crate) async fn answer_prefetched(
    state: &State,
    plan: ReadPlan,
    lookup: Option<Lookup>,
    prefetched: Option<Vec<Row>>,
) -> Result<Answer, ApiError> {
    let r = answer_inner(state, plan, lookup, (prefetched, None)).await;
    count(&r);
    r
}

fn count(r: &Result<Answer, ApiError>) {
    if let Ok(resp) = r {
        crate::metrics::global().cache_outcome(match resp.cache {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Stale => "stale",
            CacheStatus::Bypass => "bypass",
        });
    }
}

async fn answer_inner(
    state: &State,
    plan: ReadPlan,
    lookup: Option<Lookup>,
    (prefetched, early): (Option<Vec<Row>>, Option<Early>),
) -> Result<Answer, ApiError> {
    let (Some(cache), Some(lookup)) = (plan.cache.clone(), lookup) else {
        drop(early);
        let reason = match &plan.infer {
            Infer::Refused(why) => Some(why.to_string()),
            _ => None,
        };
        let rows = match prefetched {
            Some(rows) => rows,
            None => run_query(state, plan).await?,
        };
        let mut r = response(rows.into(), CacheStatus::Bypass, 0, None);
        r.bypass_reason = reason;
        return Ok(r);
    };
    let lookup = lookup.within(&cache.entry);
    // A read that will not fill lets an early lease go before it runs anything: held through
    // its query, it would keep other sidecars' misses waiting on a fill that never comes.
    let covered = state.cache.freshness().covers(plan.after);
    let fills = covered && matches!(lookup, Lookup::Miss { .. } | Lookup::Revalidate { .. });
    let early = early.filter(|_| fills);
    if !covered {
        // The change stream has not yet invalidated up to the write this read must see: an
        // entry (or a fill already under way) may hold rows from before it.
        let rows = run_query(state, plan).await?;
        return Ok(response(
            rows.into(),
            CacheStatus::Bypass,
            0,
            Some(cache.key),
        ));
    }
    let key = Some(cache.key.clone());
    let with_key = |mut r: Answer| {
        r.key = key.clone();
        r
    };
    let mode = cache.mode;
    match lookup {
        Lookup::Hit { rows, age_ms, .. } if mode != CacheMode::NoCache => {
            Ok(with_key(response(rows, CacheStatus::Hit, age_ms, None)))
        }
        Lookup::Revalidate {
            rows,
            age_ms,
            observed,
        } if mode != CacheMode::NoCache => {
            // One refresh across sidecars too: another sidecar's lease means it is refreshing.
            let identity = cache.flight_identity();
            let seen = observed.seen();
            let join = match Early::holds(&early) {
                true => Join::Never,
                false => Join::Any,
            };
            let work = fill(state, &plan, &cache, observed, None);
            let work = shared_flight::leased(state, &plan, (identity.clone(), early), work);
            state
                .flights
                .start((&identity, &seen), (&cache.key, &cache.tags), join, work);
            let mut r = response(rows, CacheStatus::Stale, age_ms, None);
            r.stale_reason = Some(StaleReason::Revalidating);
            Ok(with_key(r))
        }
        Lookup::Bypass if mode == CacheMode::OnlyIfCached => Err(ApiError::CacheUnavailable {
            internal: "only-if-cached read while redis is unavailable".into(),
        }),
        _ if mode == CacheMode::OnlyIfCached => Err(ApiError::NotCached),
        Lookup::Bypass => {
            let rows = match prefetched {
                Some(rows) => rows,
                None => run_query(state, plan).await?,
            };
            Ok(with_key(response(
                rows.into(),
                CacheStatus::Bypass,
                0,
                None,
            )))
        }
        Lookup::Hit { observed, .. } | Lookup::Revalidate { observed, .. } => {
            // no-cache: skip what was found, refresh the entry.
            let (out, answered) = fetch(state, &plan, &cache, observed, (None, early)).await;
            let out = out?;
            Ok(with_key(filled(&out, answered)))
        }
        Lookup::Miss { observed, stale } => {
            match fetch(state, &plan, &cache, observed, (prefetched, early)).await {
                (Ok(out), answered) => Ok(with_key(filled(&out, answered))),
                (Err(e), _) if is_upstream_failure(&e) => match stale {
                    Some((rows, age_ms)) => {
                        let mut r = response(rows, CacheStatus::Stale, age_ms, None);
                        r.stale_reason = Some(StaleReason::Error);
                        r.upstream_error = Some(e.code());
                        tracing::warn!(error = %e, key = %cache.key, "serving stale rows: postgres failed");
                        Ok(with_key(r))
                    }
                    None => Err(e),
                },
                (Err(e), _) => Err(e),
            }
        }
    }
}

fn response(rows: Rows, cache: CacheStatus, age_ms: u64, key: Option<String>) -> Answer {
    QueryResponse {
        rows,
        cache,
        age_ms,
        key,
        stale_reason: None,
        upstream_error: None,
        bypass_reason: None,
    }
}

/// A fill's answer: a hit when Postgres was not asked for it, the rows found in Redis behind
/// the fill's lease (`cached_age_ms`), or `answered`: the read joined the fill that long
/// after it had answered (its entry on its way to Redis; `Flights::run`).
fn filled(out: &Fetched, answered: Option<u64>) -> Answer {
    let (status, age_ms) = match (out.too_large, out.cached_age_ms.or(answered)) {
        (true, _) => (CacheStatus::Bypass, 0),
        (false, Some(age_ms)) => (CacheStatus::Hit, age_ms),
        (false, None) => (CacheStatus::Miss, 0),
    };
    response(out.rows.clone(), status, age_ms, None)
}

/// Failures of Postgres itself, for which a stale copy may stand in; the caller's own
/// mistakes (SQL errors, bad params) are never papered over.
fn is_upstream_failure(e: &ApiError) -> bool {
    matches!(
        e,
        ApiError::DatabaseUnavailable { .. }
            | ApiError::Timeout { .. }
            | ApiError::Upstream { .. }
            | ApiError::Overloaded { .. }
    )
}

/// The work of one fill: Postgres (the primary: a replica may be behind what the entry's
/// versions say), then the conditional write-back.
fn fill(
    state: &State,
    plan: &ReadPlan,
    cache: &CachePlan,
    observed: Observed,
    prefetched: Option<Vec<Row>>,
) -> impl FnOnce(Option<Held>) -> Fill {
    let s = state.clone();
    let (limits, format, who, reset) = (
        plan.limits,
        plan.format.clone(),
        plan.identity.clone(),
        plan.reset,
    );
    let (sql, params, key, entry) = (
        plan.sql.clone(),
        plan.params.clone(),
        cache.key.clone(),
        cache.entry.clone(),
    );
    let (rows_by, fingerprint) = (cache.rows_by.clone(), cache.fingerprint.clone());
    move |held: Option<Held>| {
        Box::pin(async move {
            let rows = match (&format, prefetched) {
                // Postgres already answered this read (`grouped`): only the write-back is left.
                (_, Some(rows)) => rows,
                (ReadFormat::Text { array_mode, role }, None) => {
                    let (role, who) = (role.clone(), who.clone());
                    text_query(&s, sql, &params, *array_mode, role, who, limits).await?
                }
                (ReadFormat::Json, None) => on_primary(&s, sql, params, limits, who, reset).await?,
            };
            // A top-N read depends on the rows it returned: their keys' versions read now, the
            // write-back guarded by its table's tag since the lookup. Unless they cannot be
            // named or read here: then it is answered, not written back.
            let stores = (&s.pools, &s.blocking);
            let mut observed = observed;
            let row_keys = match &rows_by {
                Some(top) => match top_keys(top, &rows) {
                    Some(keys) if s.cache.observe_keys(stores, &mut observed, &keys).await => {
                        Some(keys)
                    }
                    _ => {
                        return Ok(Fetched {
                            rows: rows.into(),
                            too_large: false,
                            released: false,
                            landed: None,
                            cached_age_ms: None,
                        })
                    }
                },
                None => None,
            };
            // The answer does not wait for the write-back: it is built now (so whether the
            // entry fits is known) and sent behind the answer, conditional as ever on the
            // versions seen before the query. The flight stays joinable until Redis has it
            // (`flight.rs`). The fill's lease is released in the write-back's round trip.
            let write = s
                .cache
                .prepare_store(&s.pools, (&key, &observed, &rows), &entry);
            let too_large = write.too_large();
            let released = held.is_some();
            let (landed_tx, landed) = tokio::sync::oneshot::channel();
            actix_web::rt::spawn(async move {
                let release = |p: &mut redis::Pipeline| {
                    if let Some(h) = &held {
                        h.release_in(p);
                    }
                };
                let behind: Option<&(dyn Fn(&mut redis::Pipeline) + Sync)> =
                    held.is_some().then_some(&release);
                let (stored, sent_behind) = s
                    .cache
                    .send_write_back((&s.pools, &s.blocking), write, behind)
                    .await;
                if stored == Stored::Written {
                    s.cache.written_back(&key, &fingerprint);
                    if let Some(keys) = row_keys {
                        s.cache.remember_rows(&key, &fingerprint, keys);
                    }
                }
                let _ = landed_tx.send(());
                if let (Some(h), false) = (&held, sent_behind) {
                    h.leases.release(&s.pools, &h.key, &h.token).await;
                }
            });
            Ok(Fetched {
                rows: rows.into(),
                too_large,
                released,
                landed: Some(landed),
                cached_age_ms: None,
            })
        })
    }
}

/// The most rows a top-N read is cached with: each is a key its lookups read.
const MAX_TOP_ROWS: usize = 64;

/// The keys of the rows a top-N read returned (their values of its column, as the change
/// stream names them), each once; None when one cannot be named, or there are too many.
fn top_keys(top: &TopN, rows: &[Row]) -> Option<Vec<String>> {
    let mut keys = rows
        .iter()
        .map(|r| {
            let text = key_text(r.get(&top.field)?, top.integer)?;
            Some(value_key(&top.table, &top.column, &text))
        })
        .collect::<Option<Vec<String>>>()?;
    keys.sort();
    keys.dedup();
    (keys.len() <= MAX_TOP_ROWS).then_some(keys)
}

/// A miss: joins or starts the single flight for the key, whose leader shares the fill with
/// other sidecars (no-cache reads fill on their own: they asked to skip what others found).
async fn fetch(
    state: &State,
    plan: &ReadPlan,
    cache: &CachePlan,
    observed: Observed,
    (prefetched, early): (Option<Vec<Row>>, Option<Early>),
) -> (Outcome, Option<u64>) {
    let identity = cache.flight_identity();
    let seen = observed.seen();
    let no_cache = cache.mode == CacheMode::NoCache;
    let join = match (no_cache, Early::holds(&early)) {
        (true, _) => Join::Unanswered,
        (false, true) => Join::Never,
        (false, false) => Join::Any,
    };
    let work = fill(state, plan, cache, observed, prefetched);
    let work: Box<dyn FnOnce() -> Fill> = if no_cache {
        Box::new(move || work(None))
    } else {
        Box::new(shared_flight::leased(
            state,
            plan,
            (identity.clone(), early),
            work,
        ))
    };
    state
        .flights
        .run(
            (&identity, &seen),
            &cache.key,
            &cache.tags,
            (state.blocking.timeout(), join),
            work,
        )
        .await
}

//! The named reads whose session need not be reset after them: which they are
//! (`named_reads`), asked in the background (`analyse_pending`, at startup and after every
//! reload) and reported (`report`: `--check-config`, the startup log). What Postgres says of one
//! statement: `store::postgres::analysis`. And the schema's watch (`check_schema`), which has
//! every verdict asked again after a change.

use crate::config::Config;
use crate::store::pools::session::{with_read_session, with_session, Reset};
use crate::store::pools::Pools;
use crate::store::postgres::analysis::analyse;
use crate::store::postgres::failure::{describe, Failure};
use crate::store::statements::class::{self, Route};
use postgres::Client;

/// The named reads whose reset is decided by their verdict, as (name, SQL): each named read
/// that leaves `skip_reset` unset (`all`: every named read), and its batch form.
pub(crate) fn named_reads(config: &Config, all: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, q) in &config.queries {
        if q.skip_reset.is_some() && !all {
            continue;
        }
        if class::classify(&q.sql, Route::Read).is_none() {
            out.push((format!("queries.{name}"), q.sql.clone()));
        }
        if let Some(b) = &q.batch_sql {
            out.push((format!("queries.{name}.batch_sql"), b.clone()));
        }
    }
    out
}

/// Each named read's verdict, asked on `client`, as `--check-config` and the startup log say
/// them: `(warning, line)`, a warning for a read the operator vouches for (`skip_reset = true`)
/// that Postgres does not find plain.
pub(crate) fn report(config: &Config, client: &mut Client) -> Result<Vec<(bool, String)>, String> {
    let mut out = Vec::new();
    for (name, sql) in named_reads(config, true) {
        let skip = config
            .queries
            .get(
                name.trim_start_matches("queries.")
                    .trim_end_matches(".batch_sql"),
            )
            .and_then(|q| q.skip_reset);
        let verdict = analyse(client, &sql, None).map_err(|e| describe(&e))?;
        out.push(match skip {
            Some(false) => (
                false,
                format!("{name}: reset after every run (skip_reset = false)"),
            ),
            Some(true) if !verdict.plain() => (
                true,
                format!(
                    "{name}: skip_reset = true, but Postgres does not find it plain ({}): \
                     what it changes in the session stays for the next request on that \
                     connection",
                    verdict.describe()
                ),
            ),
            Some(true) => (
                false,
                format!("{name}: no reset after a successful run (skip_reset = true)"),
            ),
            None => (false, format!("{name}: {}", verdict.describe())),
        });
    }
    Ok(out)
}

/// One round of the background analysis: each pending read asked on a pooled session (of
/// the role named reads run as). A session that fails leaves the rest for the next round.
pub(crate) fn analyse_pending(pools: &Pools) {
    let pending = pools.plain.pending();
    for (name, sql) in pending {
        let verdict = match with_session(pools, |s| {
            analyse(&mut s.client, &sql, None).map_err(Failure::from)
        }) {
            Ok(v) => v,
            Err(f) => {
                tracing::debug!(error = %f.into_api(), "named reads not analysed now");
                pools.plain.failed();
                return;
            }
        };
        // Said when it is new or changed; the renewals every 10 s only at debug level.
        let line = verdict.describe();
        match pools.plain.record(sql, verdict) {
            true => tracing::info!(query = %name, "{line}"),
            false => tracing::debug!(query = %name, "{line}"),
        }
    }
}

/// Reads the catalog's signature when due (every second) and, when the schema changed, has
/// every verdict asked again: named reads are reset, and reads cached with no tables named
/// are answered from Postgres, until Postgres has answered for the new schema. A session
/// that fails leaves the check for the next round. No reset after it: it only reads catalogs.
/// False until a signature was read once: verdicts asked before it could predate a change.
pub(crate) fn check_schema(pools: &Pools) -> bool {
    if !pools.schema.due() {
        return pools.schema.known();
    }
    let signature = with_read_session(pools, Reset::OnFailure, |s| {
        let row = s
            .client
            .query_one(crate::store::postgres::schema::SIGNATURE, &[])
            .map_err(Failure::from)?;
        Ok(row.get::<_, String>(0))
    });
    match signature {
        Ok(sig) => {
            if pools.schema.changed(sig) {
                tracing::debug!("the schema changed: every verdict is asked again");
                pools.plain.forget_all();
                pools.inferred.forget_all();
                pools.described.forget_all();
            }
        }
        Err(f) => tracing::debug!(error = %f.into_api(), "the schema's signature not read now"),
    }
    pools.schema.known()
}

//! What the binary checks and reports before it serves (`main.rs`, `--check-config`): the
//! library's whole surface for it, with the config, `run` and `admin`.

use crate::config::Config;
use crate::store::postgres::own_sessions::{OwnSessions, Problem};
use crate::store::postgres::roles::Audit;

pub use crate::changes::{check as check_change_stream, SetupError};
pub use crate::state::check as check_config;
pub use crate::store::postgres::role_warnings;
pub use crate::tls::install_crypto_provider;

/// The sessions Ferry would serve with, asked once: are they its own (no pooler between), and
/// are the roles kept apart? `Err`: refused for good (the sidecar must not start).
/// `Ok(Some(why))`: Postgres could not be asked. `Ok(None)`: checked and fine.
pub fn check_sessions(config: &Config) -> Result<Option<String>, String> {
    let own = match OwnSessions::for_config(config) {
        Ok(own) => own,
        Err(e) => return Ok(Some(e.to_string())),
    };
    match own.with_audit(Audit::for_config(config)).check() {
        Ok(()) => Ok(None),
        Err(Problem::Unreachable(e)) => Ok(Some(e)),
        Err(e) => Err(e.to_string()),
    }
}

/// What Postgres says of each named read: plain (no reset after a successful run) or why its
/// session is reset after it, as `(warning, line)`. `Err`: Postgres could not be asked.
pub fn named_reads(config: &Config) -> Result<Vec<(bool, String)>, String> {
    let mut client = crate::store::postgres::check_session(config)?;
    crate::store::statements::plain::report(config, &mut client)
}

/// What Ferry would do with the read `sql` (`--explain-cache`): what Postgres's own parse of
/// it says it reads and calls, whether a named query of it skips the session reset, and
/// whether it can be cached and stay fresh, on which tables. Asked on a session of
/// `postgres.url`'s role, in a transaction rolled back. `Err`: not a read, or Postgres could
/// not be asked.
pub fn explain_cache(config: &Config, sql: &str) -> Result<String, String> {
    use crate::store::statements::class::{check, Route};
    check(sql, Route::Read).map_err(|e| e.to_string())?;
    let mut client = crate::store::postgres::check_session(config)?;
    let verdict = crate::store::postgres::analysis::analyse(&mut client, sql)
        .map_err(|e| crate::store::postgres::failure::describe(&e))?;
    if let crate::store::postgres::analysis::Verdict::Unknown(why) = &verdict {
        return Err(format!("not analysed: {why}"));
    }
    Ok(crate::read::inferred::explain(&verdict, config))
}

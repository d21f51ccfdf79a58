//! Whether the schema changed: a signature of the catalog rows that decide what a statement
//! reads and may do (relations and their columns, views' rules, policies, inheritance,
//! domains' checks, enums' labels, user functions, operators and casts, which columns the
//! publications send, schemas, roles, their memberships and settings), compared once a second. Postgres's change stream carries rows, not DDL:
//! this is how a `CREATE OR REPLACE VIEW`, an `ALTER TABLE` or a `GRANT` made by anyone reaches
//! the verdicts (`verdicts`), which are then asked again.
//!
//! Every catalog row written gets the writing transaction's id as `xmin`, and a row dropped
//! is gone: the set of (oid, xmin) pairs changes with every committed DDL and with nothing
//! else (VACUUM and ANALYZE write `pg_class` in place). Only objects made after `initdb` (oid
//! 16384 and on) are counted where Postgres's own cannot change, so the query reads a few rows
//! per user object; schemas (`public` is Postgres's own, and `REVOKE USAGE` changes it) and
//! roles all.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the catalog's signature is read: how long a schema change made outside Ferry
/// (psql, a migration) may take to reach the verdicts.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// One row, one value: a hash of every user catalog row's identity and version, and of every
/// role's attributes (`pg_roles` is a view: no `xmin`). Temporary objects are left out: any
/// session's temporary table would otherwise count as a schema change.
pub(crate) const SIGNATURE: &str = "
WITH temp AS (
  SELECT oid FROM pg_namespace WHERE nspname ~ '^pg_(toast_)?temp_'
), kept AS (
  SELECT oid, xmin FROM pg_class
   WHERE oid >= 16384 AND relpersistence <> 't' AND relnamespace NOT IN (SELECT oid FROM temp)
)
SELECT md5(coalesce(string_agg(x, ',' ORDER BY x), '')) FROM (
  SELECT 'c' || oid || ':' || xmin FROM kept
  UNION ALL SELECT 'a' || attrelid || '.' || attnum || ':' || xmin
    FROM pg_attribute WHERE attnum > 0 AND attrelid IN (SELECT oid FROM kept)
  UNION ALL SELECT 'r' || oid || ':' || xmin FROM pg_rewrite WHERE ev_class IN (SELECT oid FROM kept)
  UNION ALL SELECT 'p' || oid || ':' || xmin FROM pg_policy
  UNION ALL SELECT 'i' || inhrelid || '.' || inhparent || ':' || xmin
    FROM pg_inherits WHERE inhrelid IN (SELECT oid FROM kept)
  UNION ALL SELECT 'k' || oid || ':' || xmin FROM pg_constraint WHERE contypid <> 0
  UNION ALL SELECT 't' || oid || ':' || xmin FROM pg_type
    WHERE oid >= 16384 AND typnamespace NOT IN (SELECT oid FROM temp)
  UNION ALL SELECT 'f' || oid || ':' || xmin FROM pg_proc
    WHERE oid >= 16384 AND pronamespace NOT IN (SELECT oid FROM temp)
  UNION ALL SELECT 'o' || oid || ':' || xmin FROM pg_operator WHERE oid >= 16384
  UNION ALL SELECT 'x' || oid || ':' || xmin FROM pg_cast WHERE oid >= 16384
  UNION ALL SELECT 'e' || oid || ':' || xmin FROM pg_enum WHERE oid >= 16384
  UNION ALL SELECT 'b' || oid || ':' || xmin FROM pg_publication_rel
  UNION ALL SELECT 'n' || oid || ':' || xmin FROM pg_namespace WHERE oid NOT IN (SELECT oid FROM temp)
  UNION ALL SELECT 'm' || roleid || '.' || member || ':' || xmin FROM pg_auth_members
  UNION ALL SELECT 's' || setdatabase || '.' || setrole || ':' || xmin FROM pg_db_role_setting
  UNION ALL SELECT 'u' || oid || md5(rolname || rolsuper || rolinherit || rolbypassrls)
    FROM pg_roles
) s(x)";

/// The last signature seen, and when it is next due.
#[derive(Default)]
pub(crate) struct SchemaWatch {
    state: Mutex<(Option<String>, Option<Instant>)>,
}

impl SchemaWatch {
    /// Whether a check is due (one every [`CHECK_EVERY`]); taking it starts the next period.
    pub(crate) fn due(&self) -> bool {
        let mut s = self.lock();
        if s.1.is_some_and(|t| t.elapsed() < CHECK_EVERY) {
            return false;
        }
        s.1 = Some(Instant::now());
        true
    }

    /// Takes a signature read now: true when it differs from the last one, and for the first
    /// one (verdicts asked before it may predate a change it already shows).
    pub(crate) fn changed(&self, signature: String) -> bool {
        let mut s = self.lock();
        let changed = s.0.as_ref() != Some(&signature);
        s.0 = Some(signature);
        changed
    }

    /// Whether a signature was read at all.
    pub(crate) fn known(&self) -> bool {
        self.lock().0.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<String>, Option<Instant>)> {
        // Plain data: a panic elsewhere breaks nothing here.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

//! What Postgres said about each statement's parameters, so a repeated statement runs in ONE
//! round trip.
//!
//! Binding JSON needs each parameter's type (`pg_params::to_text`), and asking Postgres costs a
//! round trip of its own (Parse/Describe) before the statement runs. With the types known from
//! an earlier run, the statement is sent as one unnamed Parse/Bind/Describe/Execute/Sync
//! (`query_typed_raw`). Result types are never cached: each run's own RowDescription says them.
//!
//! A cached type can go stale (ALTER TABLE changed a column, a type was re-created): the
//! statement then fails with a data (22) or name/type (42) error. Such a failure drops the entry
//! and the statement is run again the slow way, which describes it afresh; a failed statement
//! committed nothing, so running it again is safe for writes too.
//!
//! Bounded: statements longer than `MAX_SQL_BYTES` are not remembered, and at `MAX_ENTRIES` the
//! map starts over. A caller sending endless distinct statements costs itself a round trip,
//! never memory.

use postgres_types::Type;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const MAX_ENTRIES: usize = 1024;
const MAX_SQL_BYTES: usize = 4096;

#[derive(Default)]
pub(crate) struct ParamTypes {
    map: Mutex<HashMap<Box<str>, Arc<[Type]>>>,
}

impl ParamTypes {
    pub(crate) fn get(&self, sql: &str) -> Option<Arc<[Type]>> {
        self.lock().get(sql).cloned()
    }

    pub(crate) fn remember(&self, sql: &str, types: &[Type]) {
        if sql.len() > MAX_SQL_BYTES {
            return;
        }
        let mut map = self.lock();
        if map.len() >= MAX_ENTRIES && !map.contains_key(sql) {
            map.clear();
        }
        map.insert(sql.into(), types.into());
    }

    pub(crate) fn forget(&self, sql: &str) {
        self.lock().remove(sql);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Arc<[Type]>>> {
        // The map holds no invariant a panic could break.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether a failure of a statement run with remembered types may come from those types being
/// stale: data exceptions (22: a value no longer reads as the remembered type) and syntax or
/// name errors (42: no operator for the remembered type, a type that no longer exists).
pub(crate) fn maybe_stale(e: &postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| matches!(&db.code().code()[..2], "22" | "42"))
}

/// Whether a statement prepared by an earlier request failed as such rather than for what it
/// does: as for remembered types (22/42), or a cached plan whose result type changed under it
/// after a schema change (0A000). Such a statement is run again freshly prepared.
pub(crate) fn stale_prepared(e: &postgres::Error) -> bool {
    maybe_stale(e) || e.code() == Some(&postgres::error::SqlState::FEATURE_NOT_SUPPORTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_forgets_and_stays_bounded() {
        let p = ParamTypes::default();
        p.remember("SELECT $1", &[Type::INT4]);
        assert_eq!(p.get("SELECT $1").as_deref(), Some(&[Type::INT4][..]));
        p.forget("SELECT $1");
        assert!(p.get("SELECT $1").is_none());

        p.remember(&"x".repeat(MAX_SQL_BYTES + 1), &[]);
        assert!(p.get(&"x".repeat(MAX_SQL_BYTES + 1)).is_none());

        for i in 0..MAX_ENTRIES + 10 {
            p.remember(&format!("SELECT {i}"), &[]);
        }
        assert!(p.lock().len() <= MAX_ENTRIES);
        assert!(p.get(&format!("SELECT {}", MAX_ENTRIES + 9)).is_some());
    }
}

//! What Postgres said about each `/sql` statement's columns (its extended-protocol
//! description), by the role it runs as and its SQL. `/sql` answers in Postgres's text output,
//! which only the simple-query protocol gives, so a statement is first prepared (to refuse more
//! than one statement, and to describe the columns with their types) and then run as a simple
//! query: two parses and two round trips. A single statement met before (the same role, the
//! same text, so one statement, as checked then; not as an end user) runs as the simple query
//! alone (`statements::text`).
//!
//! A description holds until the schema changes (forgotten at the schema's check, once a
//! second: `statements::plain::check_schema`). A run whose columns are not those remembered (a
//! change within that second) is read by its own columns and described again after it ran
//! (never run twice: it may have written). A column's type changed in place under the same
//! name (`ALTER COLUMN ... TYPE`) is described as before until the check, at most a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Statements longer than this are described every time (rarely repeated, and kept whole).
const MAX_SQL_BYTES: usize = 16 * 1024;
/// Descriptions kept; the map starts again when full.
const MAX_ENTRIES: usize = 4096;

/// One column as the Neon driver is told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field {
    pub name: String,
    pub type_oid: u32,
    pub table_oid: u32,
    pub column_id: i16,
    pub type_modifier: i32,
}

/// A statement's parameters (how many) and columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Description {
    pub params: usize,
    pub fields: Vec<Field>,
}

impl Description {
    pub(crate) fn of(stmt: &tokio_postgres::Statement) -> Description {
        Description {
            params: stmt.params().len(),
            fields: stmt
                .columns()
                .iter()
                .map(|c| Field {
                    name: c.name().to_string(),
                    type_oid: c.type_().oid(),
                    table_oid: c.table_oid().unwrap_or(0),
                    column_id: c.column_id().unwrap_or(0),
                    type_modifier: c.type_modifier(),
                })
                .collect(),
        }
    }
}

/// One role's descriptions, by the statement's text.
type ByText = HashMap<Box<str>, Arc<Description>>;

/// The descriptions of each role's statements, and what they hold, in bytes.
#[derive(Default)]
struct Kept {
    by_role: HashMap<Option<Arc<str>>, ByText>,
    entries: usize,
    bytes: usize,
    /// Moved by every `forget_all`: a description made before it is not kept after it.
    generation: u64,
}

/// What a description is taken to hold beyond its text: a column's name and numbers.
const FIELD_BYTES: usize = 96;
/// The most bytes all descriptions hold (a caller can describe 1,600 columns in 200 bytes of
/// SQL): the map starts again past it.
const MAX_BYTES: usize = 8 * 1024 * 1024;
/// A statement with more columns is described every time.
const MAX_FIELDS: usize = 256;

#[derive(Default)]
pub(crate) struct Descriptions {
    kept: Mutex<Kept>,
}

impl Descriptions {
    pub(crate) fn get(&self, role: Option<&Arc<str>>, sql: &str) -> Option<Arc<Description>> {
        if sql.len() > MAX_SQL_BYTES {
            return None;
        }
        self.lock().by_role.get(&role.cloned())?.get(sql).cloned()
    }

    /// Where the schema's check stands: taken before a statement is described, and given
    /// back to [`Descriptions::remember`] (a check that forgot everything meanwhile may have
    /// come after the catalog the description was read from changed).
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    pub(crate) fn remember(
        &self,
        role: Option<&Arc<str>>,
        sql: &str,
        d: Description,
        generation: u64,
    ) {
        if sql.len() > MAX_SQL_BYTES || d.fields.len() > MAX_FIELDS {
            return;
        }
        let bytes = sql.len() + FIELD_BYTES * (d.fields.len() + 1);
        let mut kept = self.lock();
        if kept.generation != generation {
            return;
        }
        if kept.entries >= MAX_ENTRIES || kept.bytes + bytes > MAX_BYTES {
            kept.by_role.clear();
            (kept.entries, kept.bytes) = (0, 0);
        }
        let old = kept
            .by_role
            .entry(role.cloned())
            .or_default()
            .insert(sql.into(), Arc::new(d));
        if old.is_none() {
            kept.entries += 1;
            kept.bytes += bytes;
        }
    }

    pub(crate) fn forget_all(&self) {
        let mut kept = self.lock();
        kept.by_role.clear();
        (kept.entries, kept.bytes) = (0, 0);
        kept.generation += 1;
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        // The map holds no invariant a panic could break.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(fields: usize) -> Description {
        Description {
            params: 0,
            fields: (0..fields)
                .map(|i| Field {
                    name: format!("c{i}"),
                    type_oid: 23,
                    table_oid: 0,
                    column_id: 0,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    #[test]
    fn kept_by_role_bounded_and_never_from_before_a_forget() {
        let d = Descriptions::default();
        let role: Option<Arc<str>> = Some("postgres://a".into());
        let g = d.generation();
        d.remember(role.as_ref(), "SELECT 1", described(1), g);
        assert!(d.get(role.as_ref(), "SELECT 1").is_some());
        assert!(d.get(None, "SELECT 1").is_none(), "another role's");
        // Described before a forget, remembered after it: not kept.
        let before = d.generation();
        d.forget_all();
        d.remember(None, "SELECT 2", described(1), before);
        assert!(d.get(None, "SELECT 2").is_none());
        // Too wide to keep; and the bytes bound the map.
        let g = d.generation();
        d.remember(None, "SELECT wide", described(MAX_FIELDS + 1), g);
        assert!(d.get(None, "SELECT wide").is_none());
        for i in 0..(MAX_BYTES / (FIELD_BYTES * 200)) + 2 {
            d.remember(None, &format!("SELECT {i}"), described(199), g);
        }
        assert!(d.lock().bytes <= MAX_BYTES);
    }
}

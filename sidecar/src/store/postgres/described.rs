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

type Key = (Option<Arc<str>>, Box<str>);

#[derive(Default)]
pub(crate) struct Descriptions {
    map: Mutex<HashMap<Key, Arc<Description>>>,
}

impl Descriptions {
    pub(crate) fn get(&self, role: Option<&Arc<str>>, sql: &str) -> Option<Arc<Description>> {
        self.lock().get(&(role.cloned(), sql.into())).cloned()
    }

    pub(crate) fn remember(&self, role: Option<&Arc<str>>, sql: &str, d: Description) {
        if sql.len() > MAX_SQL_BYTES {
            return;
        }
        let mut map = self.lock();
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
        map.insert((role.cloned(), sql.into()), Arc::new(d));
    }

    pub(crate) fn forget_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Arc<Description>>> {
        // The map holds no invariant a panic could break.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

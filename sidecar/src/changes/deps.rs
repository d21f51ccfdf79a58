//! From a change in the stream to the cache entries it makes stale.
//!
//! A change to a row of a watched table moves the table's tag (every entry that declared the
//! table, or was inferred to read it) and, for each of the row's values, old and new, the key
//! of the reads by that value (`value_key`: inferred reads by an equality on an indexed
//! column) and of the keyspace rows keyed by it (`<keyspace>:<id>`). A value the stream did not
//! send (an old value outside the replica identity, an unchanged TOASTed one) names no key:
//! every entry named by a value of that column goes (`values_tag`; a keyspace's rows, its
//! table's reset tag): never less than needed. TRUNCATE and DDL drop every entry of the table.

use super::pgoutput::{Cell, Event, Relation};
use crate::config::{table_name, Config};
use crate::store::cache::{added_tag, moved_tag, value_key, values_tag};
use crate::store::cache::{table_reset_tag, table_tag, table_values_tag};
use crate::store::postgres::by_value::names_an_entry;
use std::collections::{BTreeMap, BTreeSet};

/// The watched tables and the keyspaces reading each.
#[derive(Debug, Clone, Default)]
pub(super) struct Watched {
    tables: BTreeMap<String, Vec<KeyedRows>>,
}

#[derive(Debug, Clone)]
struct KeyedRows {
    keyspace: String,
    key_column: String,
}

/// What one or more transactions invalidate, coalesced: a burst of changes costs Redis work
/// in proportion to the distinct keys and tables, not to the changes.
#[derive(Debug, Default)]
pub(super) struct Invalidations {
    pub keys: BTreeSet<String>,
    pub tags: BTreeSet<String>,
    /// Everything cached (a new or lost slot: nothing says what changed meanwhile).
    pub everything: bool,
    /// How many value keys each column (its `values_tag`) has moved in this batch.
    pub values_per_column: BTreeMap<String, usize>,
}

/// The most value keys one column moves in one batch: past it, every read by the column goes
/// (its `values_tag`), so a burst of changes costs Redis at most this many keys per column,
/// not one per distinct value.
const MAX_VALUES_PER_COLUMN: usize = 64;

impl Invalidations {
    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.tags.is_empty() && !self.everything
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len() + self.tags.len()
    }

    /// The reads of `table` by `column`'s value `value` go: by their key, or with every read by
    /// the column once it has moved `MAX_VALUES_PER_COLUMN` keys in this batch.
    fn value(&mut self, table: &str, column: &str, value: &str) {
        let tag = values_tag(table, column);
        if self.tags.contains(&tag) {
            return;
        }
        let moved = self.values_per_column.entry(tag).or_default();
        if *moved == MAX_VALUES_PER_COLUMN {
            self.tags.insert(values_tag(table, column));
        } else if self.keys.insert(value_key(table, column, value)) {
            *moved += 1;
        }
    }
}

impl Watched {
    pub(super) fn from_config(config: &Config) -> Watched {
        let mut tables: BTreeMap<String, Vec<KeyedRows>> = config
            .watched_tables()
            .into_iter()
            .map(|t| (t, Vec::new()))
            .collect();
        for (name, ks) in &config.keyspaces {
            if let Some(t) = ks.table.as_deref().and_then(table_name) {
                tables.entry(t).or_default().push(KeyedRows {
                    keyspace: name.clone(),
                    key_column: ks.key_column.clone(),
                });
            }
        }
        Watched { tables }
    }

    pub(super) fn tables(&self) -> impl Iterator<Item = &String> {
        self.tables.keys()
    }

    /// Adds what `event` makes stale to `into`.
    pub(super) fn note(&self, event: &Event<'_>, into: &mut Invalidations) {
        match event {
            Event::Row { relation, old, new } => self.row(relation, [old, new], into),
            Event::Truncate { tables } => {
                for t in tables {
                    self.whole_table(t, into);
                }
            }
            Event::Redefined { table } => self.whole_table(table, into),
            Event::Other => {}
        }
    }

    /// TRUNCATE, DDL: every entry that depends on `table`, keyspace rows included.
    pub(super) fn whole_table(&self, table: &str, into: &mut Invalidations) {
        if self.tables.contains_key(table) {
            into.tags.insert(table_tag(table));
            into.tags.insert(table_reset_tag(table));
            into.tags.insert(table_values_tag(table));
        }
    }

    /// The table's tag, and each value of the row, old and new, by its column: the reads by
    /// that value and the keyspace rows keyed by it.
    fn row(&self, relation: &Relation, rows: [&Option<Vec<Cell>>; 2], into: &mut Invalidations) {
        let Some(keyed) = self.tables.get(&relation.table) else {
            return;
        };
        let table = &relation.table;
        into.tags.insert(table_tag(table));
        let (legacy_keys, reset) = super::legacy::row_keys(relation, rows);
        into.keys.extend(legacy_keys);
        if reset {
            into.tags.insert(table_reset_tag(table));
        }
        ordered(relation, rows, into);
        for (i, column) in relation.columns.iter().enumerate() {
            let keyspaces = keyed.iter().filter(|k| k.key_column == column.name);
            for cells in rows.into_iter().flatten() {
                match cells.get(i) {
                    Some(Cell::Text(v)) => {
                        if names_an_entry(v) {
                            into.value(table, &column.name, v);
                        }
                        for k in keyspaces.clone() {
                            into.keys.insert(format!("{}:{v}", k.keyspace));
                        }
                    }
                    // A NULL matches no equality and names no keyspace row.
                    Some(Cell::Null) => {}
                    Some(Cell::Unsent) | None => {
                        into.tags.insert(values_tag(table, &column.name));
                        if keyspaces.clone().next().is_some() {
                            into.tags.insert(table_reset_tag(table));
                        }
                    }
                }
            }
        }
        // A keyspace keyed by a column the stream does not describe: its rows are unknown.
        if keyed
            .iter()
            .any(|k| !relation.columns.iter().any(|c| c.name == k.key_column))
        {
            into.tags.insert(table_reset_tag(table));
        }
    }
}

/// What top-N reads by a column's order depend on besides the rows they returned: a new row
/// (an INSERT moves the table's `added_tag`) and a row whose value of the column changed (an
/// UPDATE whose old value was sent and differs moves the column's `moved_tag`; one not sent
/// moves its `values_tag` above).
fn ordered(relation: &Relation, [old, new]: [&Option<Vec<Cell>>; 2], into: &mut Invalidations) {
    let table = &relation.table;
    let (old, new) = match (old, new) {
        (None, Some(_)) => {
            into.tags.insert(added_tag(table));
            return;
        }
        (Some(old), Some(new)) => (old, new),
        _ => return,
    };
    for (i, column) in relation.columns.iter().enumerate() {
        let changed = match (old.get(i), new.get(i)) {
            (Some(Cell::Text(a)), Some(Cell::Text(b))) => a != b,
            (Some(Cell::Null), Some(Cell::Null)) => false,
            // An unchanged TOASTed value is not sent: it did not change.
            (Some(Cell::Text(_) | Cell::Null), Some(Cell::Unsent)) => false,
            (Some(Cell::Text(_) | Cell::Null), _) => true,
            // Not sent (moves the column's `values_tag`), or not described.
            _ => false,
        };
        if changed {
            into.tags.insert(moved_tag(table, &column.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pgoutput::Column;
    use super::*;
    use crate::config::Keyspace;
    use crate::store::cache::legacy_row_key;

    fn watched() -> Watched {
        let mut c = Config::default();
        c.keyspaces.insert(
            "items".into(),
            Keyspace {
                sql: "SELECT 1".into(),
                key_column: "id".into(),
                ttl_s: 1,
                tags: vec![],
                table: Some("items".into()),
            },
        );
        c.changes.tables = vec!["orders".into()];
        Watched::from_config(&c)
    }

    fn items(id_in_identity: bool) -> Relation {
        Relation {
            table: "public.items".into(),
            columns: vec![
                Column {
                    name: "id".into(),
                    in_identity: id_in_identity,
                },
                Column {
                    name: "name".into(),
                    in_identity: false,
                },
            ],
            identity_full: false,
            identity_is_key: true,
        }
    }

    fn text(v: &str) -> Cell {
        Cell::Text(v.into())
    }

    #[test]
    fn a_row_change_drops_the_keys_of_its_values_old_and_new_and_the_table_tag() {
        let w = watched();
        let rel = items(true);
        let mut inv = Invalidations::default();
        // A key changed: the old row came as its identity (the name was not sent).
        let moved = Event::Row {
            relation: &rel,
            old: Some(vec![text("1"), Cell::Unsent]),
            new: Some(vec![text("2"), text("x")]),
        };
        w.note(&moved, &mut inv);
        assert_eq!(
            inv.keys,
            BTreeSet::from([
                "items:1".to_string(),
                "items:2".to_string(),
                value_key("public.items", "id", "1"),
                value_key("public.items", "id", "2"),
                legacy_row_key("public.items", "1"),
                legacy_row_key("public.items", "2"),
            ])
        );
        // The old name is unknown: every read by a name goes (the new name's key with them);
        // reads by other ids stay. The id changed: top-N reads in its order go.
        assert_eq!(
            inv.tags,
            BTreeSet::from([
                table_tag("public.items"),
                values_tag("public.items", "name"),
                moved_tag("public.items", "id"),
            ])
        );
    }

    #[test]
    fn an_insert_names_its_values_alone_and_long_values_name_no_read() {
        let w = watched();
        let rel = items(true);
        let mut inv = Invalidations::default();
        let long = "x".repeat(crate::store::postgres::by_value::MAX_VALUE_KEY + 1);
        let insert = Event::Row {
            relation: &rel,
            old: None,
            new: Some(vec![text("7"), text(&long)]),
        };
        w.note(&insert, &mut inv);
        assert_eq!(
            inv.keys,
            BTreeSet::from([
                "items:7".to_string(),
                value_key("public.items", "id", "7"),
                legacy_row_key("public.items", "7")
            ])
        );
        assert_eq!(
            inv.tags,
            BTreeSet::from([table_tag("public.items"), added_tag("public.items")])
        );
    }

    #[test]
    fn an_update_under_full_identity_moves_the_order_of_what_changed_only() {
        let w = watched();
        let rel = items(true);
        let mut inv = Invalidations::default();
        let edit = Event::Row {
            relation: &rel,
            old: Some(vec![text("7"), text("a")]),
            new: Some(vec![text("7"), text("b")]),
        };
        w.note(&edit, &mut inv);
        assert!(inv.tags.contains(&moved_tag("public.items", "name")));
        assert!(!inv.tags.contains(&moved_tag("public.items", "id")));
        assert!(!inv.tags.contains(&added_tag("public.items")));
    }

    #[test]
    fn a_burst_moves_a_bounded_number_of_keys_per_column() {
        let w = watched();
        let rel = items(true);
        let mut inv = Invalidations::default();
        for i in 0..1000 {
            let insert = Event::Row {
                relation: &rel,
                old: None,
                new: Some(vec![text(&i.to_string()), text("same")]),
            };
            w.note(&insert, &mut inv);
        }
        let by = |prefix: &str| inv.keys.iter().filter(|k| k.starts_with(prefix)).count();
        assert_eq!(by("items:"), 1000, "a keyspace's rows are never coalesced");
        assert_eq!(
            by(&value_key("public.items", "id", "")),
            MAX_VALUES_PER_COLUMN
        );
        assert_eq!(by(&value_key("public.items", "name", "")), 1);
        assert!(inv.tags.contains(&values_tag("public.items", "id")));
        assert!(!inv.tags.contains(&values_tag("public.items", "name")));
    }

    #[test]
    fn a_keyspace_id_outside_the_identity_is_unknown_on_delete() {
        let w = watched();
        let rel = items(false);
        let mut inv = Invalidations::default();
        let delete = Event::Row {
            relation: &rel,
            old: Some(vec![Cell::Unsent, Cell::Unsent]),
            new: None,
        };
        w.note(&delete, &mut inv);
        assert!(inv.tags.contains(&values_tag("public.items", "id")));
        assert!(inv.tags.contains(&table_reset_tag("public.items")));
        assert!(inv.keys.is_empty(), "{:?}", inv.keys);
    }

    #[test]
    fn unwatched_tables_cost_nothing_and_truncate_drops_all() {
        let w = watched();
        let mut rel = items(true);
        rel.table = "public.other".into();
        let mut inv = Invalidations::default();
        w.note(
            &Event::Row {
                relation: &rel,
                old: None,
                new: Some(vec![text("1")]),
            },
            &mut inv,
        );
        assert!(inv.is_empty());
        w.note(
            &Event::Truncate {
                tables: vec!["public.orders".into()],
            },
            &mut inv,
        );
        assert_eq!(
            inv.tags,
            BTreeSet::from([
                table_tag("public.orders"),
                table_reset_tag("public.orders"),
                table_values_tag("public.orders")
            ])
        );
    }
}

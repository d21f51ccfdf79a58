//! From a change in the stream to the cache entries it makes stale.
//!
//! A change to a row of a watched table moves the table's tag (every entry that declared the
//! table) and the keys of that row in each keyspace on the table (`<keyspace>:<id>`, for the
//! old and the new id). When a row's id cannot be known for certain (the key column is not in
//! the replica identity, or its value did not come with the change), the keyspace's rows are
//! dropped as a whole (the table's reset tag): never less than needed. TRUNCATE and DDL drop
//! both the table's entries and its keyspace rows.

use super::pgoutput::{Cell, Event, Relation};
use crate::config::{table_name, Config};
use crate::store::cache::{row_key, table_reset_tag, table_tag};
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
}

impl Invalidations {
    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.tags.is_empty() && !self.everything
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len() + self.tags.len()
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
            Event::Row { relation, old, new } => self.row(relation, old, new, into),
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
        }
    }

    /// The row's own key (`row_key`), old and new, when its replica identity is a one-column
    /// primary key (the default identity): what inferred point reads by that key depend on. The
    /// identity column always comes with the change (old only when it changed). Any other
    /// identity (FULL, another index, several columns: the table's may have changed since a
    /// point read was cached) drops every row's entries (the reset tag): never less than needed.
    fn by_identity(
        relation: &Relation,
        old: &Option<Vec<Cell>>,
        new: &Option<Vec<Cell>>,
        into: &mut Invalidations,
    ) {
        let mut identity = relation
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.in_identity);
        let (Some((i, _)), None, true) =
            (identity.next(), identity.next(), relation.identity_is_key)
        else {
            into.tags.insert(table_reset_tag(&relation.table));
            return;
        };
        for tuple in [old, new].into_iter().flatten() {
            match tuple.get(i) {
                Some(Cell::Text(id)) => {
                    into.keys.insert(row_key(&relation.table, id));
                }
                Some(Cell::Null) => {}
                _ => {
                    into.tags.insert(table_reset_tag(&relation.table));
                }
            }
        }
    }

    fn row(
        &self,
        relation: &Relation,
        old: &Option<Vec<Cell>>,
        new: &Option<Vec<Cell>>,
        into: &mut Invalidations,
    ) {
        let Some(keyed) = self.tables.get(&relation.table) else {
            return;
        };
        into.tags.insert(table_tag(&relation.table));
        Self::by_identity(relation, old, new, into);
        for k in keyed {
            let Some(i) = relation.columns.iter().position(|c| c.name == k.key_column) else {
                into.tags.insert(table_reset_tag(&relation.table));
                continue;
            };
            // An UPDATE without the old identity kept the identity: the old id is the new one
            // only if the key column is part of it.
            let old_id_known = old.is_some()
                || new.is_none()
                || relation.identity_full
                || relation.columns[i].in_identity;
            if !old_id_known {
                into.tags.insert(table_reset_tag(&relation.table));
            }
            for tuple in [old, new].into_iter().flatten() {
                match tuple.get(i) {
                    Some(Cell::Text(id)) => {
                        into.keys.insert(format!("{}:{id}", k.keyspace));
                    }
                    // A NULL id names no entry; an id the stream did not send is unknown.
                    Some(Cell::Null) => {}
                    _ => {
                        into.tags.insert(table_reset_tag(&relation.table));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pgoutput::Column;
    use super::*;
    use crate::config::Keyspace;

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
    fn a_row_change_drops_its_keys_and_the_table_tag() {
        let w = watched();
        let rel = items(true);
        let mut inv = Invalidations::default();
        let moved = Event::Row {
            relation: &rel,
            old: Some(vec![text("1"), Cell::Null]),
            new: Some(vec![text("2"), text("x")]),
        };
        w.note(&moved, &mut inv);
        // The keyspace's rows, and the rows by their identity (inferred point reads).
        assert_eq!(
            inv.keys,
            BTreeSet::from([
                "items:1".to_string(),
                "items:2".to_string(),
                row_key("public.items", "1"),
                row_key("public.items", "2"),
            ])
        );
        assert_eq!(inv.tags, BTreeSet::from([table_tag("public.items")]));
    }

    #[test]
    fn an_unknown_old_id_drops_the_keyspace() {
        let w = watched();
        let rel = items(false);
        let mut inv = Invalidations::default();
        let update = Event::Row {
            relation: &rel,
            old: None,
            new: Some(vec![text("2"), text("x")]),
        };
        w.note(&update, &mut inv);
        assert!(inv.tags.contains(&table_reset_tag("public.items")));
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
            BTreeSet::from([table_tag("public.orders"), table_reset_tag("public.orders")])
        );
    }
}

//! What versions before 2026-12-05 named point reads by (`legacy_row_key`), moved as they
//! moved it, for their sidecars during a rolling deploy. Remove once no such version runs.

use super::pgoutput::{Cell, Relation};
use crate::store::cache::legacy_row_key;

/// The keys of a changed row under a one-column default identity, old and new; and whether
/// the table's reset tag must move instead (another identity, or an id not sent).
pub(super) fn row_keys(relation: &Relation, rows: [&Option<Vec<Cell>>; 2]) -> (Vec<String>, bool) {
    let mut identity = relation
        .columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.in_identity);
    let (Some((i, _)), None, true) = (identity.next(), identity.next(), relation.identity_is_key)
    else {
        return (Vec::new(), true);
    };
    let (mut keys, mut reset) = (Vec::new(), false);
    for cells in rows.into_iter().flatten() {
        match cells.get(i) {
            Some(Cell::Text(id)) => keys.push(legacy_row_key(&relation.table, id)),
            Some(Cell::Null) => {}
            _ => reset = true,
        }
    }
    (keys, reset)
}

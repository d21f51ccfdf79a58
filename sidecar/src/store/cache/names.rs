//! What entries and tags are called: the names Ferry derives from tables, rows and values,
//! which the change stream moves (`changes/`) and inferred reads carry (`read::inferred`).

/// The implicit tag every entry carries: the cache-wide epoch (not a name callers can send:
/// tags may not contain control characters).
pub(super) const EPOCH_TAG: &str = "\u{0}epoch";

/// Marks the tags Ferry derives from table names (never a caller's tag: no control characters).
pub(super) const TABLE_TAG: &str = "\u{0}table:";
pub(super) const TABLE_RESET_TAG: &str = "\u{0}table-reset:";
pub(super) const VALUES_TAG: &str = "\u{0}values:";
pub(super) const TABLE_VALUES_TAG: &str = "\u{0}table-values:";
/// Marks a tag that is another key's version (`v:<key>`, not `t:<tag>`): an entry named by
/// one value that also depends on the rows of other values (a join read by value, each table
/// by its own column) carries their keys as such tags (`key_tag`).
pub(super) const KEY_TAG: &str = "\u{0}key:";
pub(super) const ADDED_TAG: &str = "\u{0}table-added:";
pub(super) const MOVED_TAG: &str = "\u{0}moved:";
/// Marks a tag a fill's write-back checks but its entry does not carry (`guard_tag`).
pub(super) const GUARD_TAG: &str = "\u{0}guard:";
/// Moved by each consumer of the change stream as it starts: entries named by a value made
/// before it were kept fresh by another consumer, perhaps one that moved no value keys (a
/// version before them, in a rolling deploy).
pub(crate) const VALUES_EPOCH_TAG: &str = "\u{0}values-epoch";

/// The tag of entries that depend on a whole table (`cache.tables`): moved by every committed
/// change to the table, whoever made it (see `changes/`).
pub(crate) fn table_tag(table: &str) -> String {
    format!("{TABLE_TAG}{table}")
}

/// The key earlier versions (before 2026-12-05) named a point read of row `id` by: still moved
/// by the change stream, for those versions' sidecars during a rolling deploy.
pub(crate) fn legacy_row_key(table: &str, id: &str) -> String {
    format!("~row:{table}:{id}")
}

/// The tag of every entry named by a value of any column of `table`: moved by TRUNCATE, DDL
/// and an invalidation of the table by name.
pub(crate) fn table_values_tag(table: &str) -> String {
    format!("{TABLE_VALUES_TAG}{table}")
}

/// The key of the entries of reads of `table`'s rows whose `column` holds `value` (inferred
/// reads by an equality on an indexed column, `read::inferred`): moved by the change stream
/// when a row with that value, old or new, changes. They carry `values_tag` of the column for
/// the changes whose old value the stream did not send, `table_values_tag` for TRUNCATE and
/// DDL, and `VALUES_EPOCH_TAG`; not the table's tag.
pub(crate) fn value_key(table: &str, column: &str, value: &str) -> String {
    format!("~val:{table}.{column}:{value}")
}

/// The tag of every entry named by a value of `table.column` (`value_key`): moved by a change
/// whose old value of the column was not sent.
pub(crate) fn values_tag(table: &str, column: &str) -> String {
    format!("{VALUES_TAG}{table}.{column}")
}

/// The tag every row of a keyspace on `table` carries: moved when the table changes as a whole
/// (TRUNCATE, DDL, an invalidation of the table by name) and by a change whose old id the
/// stream did not send.
pub(crate) fn table_reset_tag(table: &str) -> String {
    format!("{TABLE_RESET_TAG}{table}")
}

/// The tag that is `key`'s version: an entry carrying it is valid only while the key's version
/// is the one its read saw, as for the key that names it. Kept as long as the entries carrying
/// it, as that key's version is (a lookup makes it for the flight only).
pub(crate) fn key_tag(key: &str) -> String {
    format!("{KEY_TAG}{key}")
}

/// The tag of the entries a new row of `table` may change (top-N reads): moved by every
/// INSERT into it.
pub(crate) fn added_tag(table: &str) -> String {
    format!("{ADDED_TAG}{table}")
}

/// The tag of the entries a row whose `column` changed may change (top-N reads by the
/// column's order): moved by an UPDATE whose old value of the column was sent and differs from
/// the new (one not sent moves `values_tag`).
pub(crate) fn moved_tag(table: &str, column: &str) -> String {
    format!("{MOVED_TAG}{table}.{column}")
}

/// `tag`, checked by a fill's write-back (unmoved since its lookup) but not carried by the
/// entry it writes: a read whose dependencies are known only from its rows (top-N reads) is
/// written back only if no change to its table reached the cache while it ran.
pub(crate) fn guard_tag(tag: &str) -> String {
    format!("{GUARD_TAG}{tag}")
}

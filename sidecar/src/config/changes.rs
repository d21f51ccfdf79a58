//! `[changes]`: invalidation from Postgres's own change stream (logical decoding), and the
//! table names cached reads declare they depend on.

use super::{Config, ConfigError, RedactedUrl};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ChangesConfig {
    /// Invalidate cached reads from Postgres's change stream, so writes from any client (psql,
    /// migrations, other services) drop the entries that depend on what they changed. Needs
    /// `wal_level = logical` and a role with REPLICATION. Off: TTLs and explicit invalidation.
    pub enabled: bool,
    /// The stream's own connection URL, for a role with REPLICATION (and SELECT on the watched
    /// tables) apart from the one requests use: a REPLICATION role could read every table's
    /// changes, which the request role must not. Empty: `postgres.url`.
    pub url: RedactedUrl,
    /// The durable logical replication slot (pgoutput); created when missing.
    pub slot: String,
    /// The publication the slot streams; created when missing, FOR TABLE the watched tables.
    pub publication: String,
    /// Tables raw-SQL reads may declare in `cache.tables`, beyond those of `[queries]` and
    /// `[keyspaces]` (which are watched anyway). `schema.table`; `public.` when unqualified.
    pub tables: Vec<String>,
    /// Reads bypass the cache while the stream's invalidations lag further than this behind
    /// commits, in milliseconds: the longest a read can see rows older than a commit.
    pub max_lag_ms: u64,
    /// How often the consuming sidecar marks its position in the stream (a WAL message, and a
    /// look at the watched tables' definitions for DDL), in milliseconds.
    pub heartbeat_ms: u64,
    /// Slot lag, in bytes of WAL kept for Ferry, past which /metrics raises
    /// `ferry_changes_slot_lag_alert` (bound it for good with `max_slot_wal_keep_size`).
    pub alert_lag_bytes: u64,
}

impl Default for ChangesConfig {
    fn default() -> Self {
        ChangesConfig {
            enabled: false,
            url: RedactedUrl::default(),
            slot: "ferry".into(),
            publication: "ferry".into(),
            tables: Vec::new(),
            max_lag_ms: 1_000,
            heartbeat_ms: 100,
            alert_lag_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// A table name as the change stream reports it: `schema.table`, lower case (Postgres folds
/// unquoted names), `public` when unqualified. None when it is not a plain identifier pair
/// (quoted names are not supported).
pub fn table_name(raw: &str) -> Option<String> {
    let lower = raw.trim().to_ascii_lowercase();
    match lower.split_once('.') {
        Some((schema, table)) if ident(schema) && ident(table) => Some(lower),
        None if ident(&lower) => Some(format!("public.{lower}")),
        _ => None,
    }
}

/// A plain identifier as `table_name` takes it (either case).
fn ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with(|c: char| c.is_ascii_digit() || c == '$')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// Whether `table_name(raw)` is `qualified`, without making it.
fn names(raw: &str, qualified: &str) -> bool {
    // `raw` lowered is `name` (which may hold upper case: a quoted relation is not `raw`'s).
    let lowers_to = |raw: &str, name: &str| {
        raw.len() == name.len()
            && raw
                .bytes()
                .zip(name.bytes())
                .all(|(r, n)| r.to_ascii_lowercase() == n)
    };
    let raw = raw.trim();
    match raw.split_once('.') {
        Some((schema, table)) => ident(schema) && ident(table) && lowers_to(raw, qualified),
        None => {
            ident(raw)
                && qualified
                    .strip_prefix("public.")
                    .is_some_and(|t| lowers_to(raw, t))
        }
    }
}

impl Config {
    /// The configuration the stream connects with: `changes.url` in place of `postgres.url`
    /// when set (then without `postgres.password_file`'s password, which is the other role's).
    pub fn stream_config(&self) -> Config {
        let mut c = self.clone();
        if !self.changes.url.is_empty() {
            c.postgres.url = self.changes.url.clone();
            c.postgres.password = None;
        }
        c
    }

    /// Whether the change stream watches `qualified` (`schema.table`, lower case): a member of
    /// [`Config::watched_tables`], asked without building the set (every inferred read asks).
    pub fn watches(&self, qualified: &str) -> bool {
        self.stream_tables().any(|t| names(t, qualified))
    }

    /// The tables the configuration asks the stream for, as written.
    fn stream_tables(&self) -> impl Iterator<Item = &String> {
        let named = self.queries.values().flat_map(|q| q.tables.iter());
        let keyed = self.keyspaces.values().filter_map(|k| k.table.as_ref());
        self.changes.tables.iter().chain(named).chain(keyed)
    }

    /// Every table the change stream watches: `changes.tables`, the named queries' `tables`
    /// and the keyspaces' `table`, normalized by [`table_name`] (invalid names are skipped
    /// here; `validate` refuses them).
    pub fn watched_tables(&self) -> BTreeSet<String> {
        self.stream_tables().filter_map(|t| table_name(t)).collect()
    }

    pub(super) fn validate_changes(&self) -> Result<(), ConfigError> {
        let invalid = |key: String, message: String| Err(ConfigError::Invalid { key, message });
        let c = &self.changes;
        let ident_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !ident_ok(&c.slot) {
            return invalid(
                "changes.slot".into(),
                "1-63 of a-z, 0-9 and _ (a replication slot name)".into(),
            );
        }
        if !ident_ok(&c.publication) {
            return invalid(
                "changes.publication".into(),
                "1-63 of a-z, 0-9 and _".into(),
            );
        }
        if c.heartbeat_ms == 0 || c.max_lag_ms < 2 * c.heartbeat_ms {
            return invalid(
                "changes.max_lag_ms".into(),
                "must be at least twice changes.heartbeat_ms (and heartbeat_ms at least 1)".into(),
            );
        }
        let names = c
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("changes.tables[{i}]"), t));
        let named = self.queries.iter().flat_map(|(n, q)| {
            q.tables
                .iter()
                .enumerate()
                .map(move |(i, t)| (format!("queries.{n}.tables[{i}]"), t))
        });
        let keyed = self.keyspaces.iter().filter_map(|(n, k)| {
            k.table
                .as_ref()
                .map(|t| (format!("keyspaces.{n}.table"), t))
        });
        for (key, t) in names.chain(named).chain(keyed) {
            if table_name(t).is_none() {
                return invalid(
                    key,
                    format!("{t:?} is not a table name (schema.table or table, unquoted)"),
                );
            }
        }
        if c.enabled && self.watched_tables().is_empty() {
            return invalid(
                "changes.enabled".into(),
                "no table to watch: declare tables in [queries.NAME] tables, [keyspaces.NAME] \
                 table or changes.tables"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_normalized() {
        assert_eq!(table_name("items").as_deref(), Some("public.items"));
        assert_eq!(table_name("Shop.Items").as_deref(), Some("shop.items"));
        for bad in ["", "a.b.c", "\"Items\"", "1x", "a b", "items;drop"] {
            assert_eq!(table_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_agrees_with_table_name() {
        let raws = [
            "items",
            "Items",
            " shop.Items ",
            "public.items",
            "PUBLIC.ITEMS",
            "shop.items",
            "",
            "a.b.c",
            "\"Items\"",
            "1x",
            "a b",
            "items;drop",
            "public.",
            ".items",
        ];
        let qualified = [
            "public.items",
            "shop.items",
            "public.Items",
            "Shop.items",
            "public.a b",
            "public.1x",
            "a.b.c",
        ];
        for raw in raws {
            for q in qualified {
                assert_eq!(
                    names(raw, q),
                    table_name(raw).as_deref() == Some(q),
                    "{raw:?} against {q:?}"
                );
            }
        }
    }
}

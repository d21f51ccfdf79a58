//! The statements the config names (`[queries.NAME]`) and the keyspaces read by id
//! (`[keyspaces.NAME]`).

use serde::{Deserialize, Serialize};

/// A statement the config names, with an optional default cache policy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedQuery {
    pub sql: String,
    /// Reads of this query are cached this long, in seconds, unless the request says otherwise.
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// Stale-while-revalidate window after the TTL, in seconds.
    #[serde(default)]
    pub swr_s: Option<u64>,
    /// Stale-if-error grace after the TTL, in seconds.
    #[serde(default)]
    pub stale_if_error_s: Option<u64>,
    /// Tags its cached results carry.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Tables its results depend on: with `[changes]` on, any committed change to one of
    /// them (from any writer) drops its cached results.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Whether the session is reset (`DISCARD ALL`) after a successful run of this read.
    /// Unset (the default): skipped once Postgres has found the statement plain (every
    /// function it calls, directly or through a view, a policy or a domain, one of Postgres's
    /// own and immutable or stable: `store::postgres::analysis`),
    /// which saves Postgres about a third of an uncached point read's CPU and keeps the
    /// statement prepared on its session. `false`: always reset. `true`: skipped whatever
    /// Postgres says (the operator vouches that the statement changes nothing in the session;
    /// startup and `--check-config` warn when Postgres finds a volatile function in it). Runs
    /// as an end user (`identity`), failed runs and raw SQL are reset all the same, and so is
    /// every session a raw or other statement used before this one.
    #[serde(default)]
    pub skip_reset: Option<bool>,
    /// Its batch form: the same read for many values of its one parameter at once, taking
    /// them as an array in `$1` (`... WHERE id = ANY($1)`), each parameter's rows in the
    /// order the statement itself gives them. With `batch_key`, the column each row carries
    /// its parameter in. A batch's misses of this query then cost one statement
    /// (`read::grouped`).
    #[serde(default)]
    pub batch_sql: Option<String>,
    #[serde(default)]
    pub batch_key: Option<String>,
}

/// Rows addressed by one key column, read many at a time.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Keyspace {
    /// Takes the missing ids as an array in `$1`: `SELECT ... FROM items WHERE id = ANY($1)`.
    pub sql: String,
    /// The column whose value is the id (`id`).
    pub key_column: String,
    /// Seconds each row stays cached.
    pub ttl_s: u64,
    /// Tags every row of the keyspace carries (invalidate them all by tag).
    #[serde(default)]
    pub tags: Vec<String>,
    /// The table the rows come from: with `[changes]` on, a change to row 7 drops the entry
    /// `<keyspace>:7` (its `key_column` must be in the table's replica identity, e.g. the
    /// primary key, or every change drops the whole keyspace).
    #[serde(default)]
    pub table: Option<String>,
}

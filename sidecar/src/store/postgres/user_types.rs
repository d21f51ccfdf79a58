//! A new session learns the database's own types (enums, domains, ranges, and arrays of them)
//! before it serves anything. The driver looks a type up by OID with statements it prepares
//! once and keeps for the session's life, and Ferry's reset after each request
//! (`DISCARD ALL`) deallocates them behind its back: a lookup after a reset finds its
//! statement gone (26000; the session is then dropped and a read run again on another,
//! `failure::driver_statement_lost`). The driver keeps the types it has resolved, which stay
//! true (an OID names one type for its life; Ferry reads an enum as its label's text and a
//! domain by its base type, which no DDL changes), so a session that learnt every type at
//! connect never looks one up again. A type made later, or past the most learnt, costs each
//! session that meets it after a reset: dropped as lost, the read run on another (a new
//! session learns it at connect).

/// The most types a session learns at connect: each costs the driver a round trip or two
/// (about 0.1 ms on a loopback, an RTT on a hosted database), once per connection.
const MOST: i64 = 256;

/// One statement whose columns are a NULL of each type the role may use, made by Postgres: the
/// database's own enums, domains, ranges and extensions' base types (`citext`, `vector`), then
/// arrays of them. Not composite types (every table is one; Ferry reads none).
const COLUMNS_OF_EACH: &str = "
WITH own AS (
  SELECT oid, typelem FROM pg_type
   WHERE oid >= 16384 AND typtype IN ('b', 'e', 'd', 'r', 'm') AND has_type_privilege(oid, 'USAGE')
     AND NOT pg_is_other_temp_schema(typnamespace)
)
SELECT 'SELECT ' || string_agg(format('NULL::%s', t), ', ')
  FROM (SELECT oid::regtype::text AS t FROM own
         WHERE typelem = 0 OR typelem IN (SELECT oid FROM own)
         ORDER BY typelem <> 0, oid LIMIT $1) mine";

/// The learning statement for this session's role: None when the database has no type of its
/// own (or the role may use none).
fn statement(rows: Option<String>) -> Option<String> {
    rows.filter(|s| s.len() > "SELECT ".len())
}

/// Learns the types on a blocking session. A failure is not the session's: it then looks
/// types up as it meets them.
pub(crate) fn learn(client: &mut postgres::Client) {
    let sql = client
        .query_one(COLUMNS_OF_EACH, &[&MOST])
        .ok()
        .and_then(|r| statement(r.get(0)));
    if let Some(sql) = sql {
        // Preparing is enough: the driver resolves each column's type to describe it.
        if let Err(e) = client.prepare(&sql) {
            tracing::debug!(error = %e, "a new session did not learn the database's types");
        }
    }
}

/// [`learn`] on a session of a worker's event loop.
pub(crate) async fn learn_async(client: &tokio_postgres::Client) {
    let sql = client
        .query_one(COLUMNS_OF_EACH, &[&MOST])
        .await
        .ok()
        .and_then(|r| statement(r.get(0)));
    if let Some(sql) = sql {
        if let Err(e) = client.prepare(&sql).await {
            tracing::debug!(error = %e, "a new session did not learn the database's types");
        }
    }
}

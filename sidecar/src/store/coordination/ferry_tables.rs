//! Ferry's own tables in Postgres (`auth.nonce_table`, `cache.deferred_table`): state every
//! sidecar must share that has to outlive Redis. Each is created on first use by Ferry's own
//! role (`postgres.owner_url`), in a schema it owns (scripts/demo.sql makes `ferry` for it);
//! no request role is granted anything on them.

use crate::store::pools::session::rollback;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::PgSession;

/// Creates `table` (validated: `schema.table`, unquoted identifiers) with `columns` unless it
/// exists. Several sidecars may race here: one creates it, the others find it.
pub(in crate::store) fn ensure(
    s: &mut PgSession,
    table: &str,
    columns: &str,
) -> Result<(), Failure> {
    let exists = |s: &mut PgSession| {
        s.client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .map(|r| r.get::<_, bool>(0))
    };
    if exists(s).map_err(Failure::from)? {
        return Ok(());
    }
    // Its schema too, when missing (Ferry's own, `ferry`, unless an operator made it). Only
    // when missing: CREATE SCHEMA IF NOT EXISTS asks for CREATE on the database even then.
    let schema = match table.split_once('.') {
        Some((schema, _)) => {
            let missing: bool = s
                .client
                .query_one("SELECT to_regnamespace($1) IS NULL", &[&schema])
                .map_err(Failure::from)?
                .get(0);
            if missing {
                format!("CREATE SCHEMA IF NOT EXISTS {schema}; ")
            } else {
                String::new()
            }
        }
        None => String::new(),
    };
    let create =
        format!("BEGIN READ WRITE; {schema}CREATE TABLE IF NOT EXISTS {table} {columns}; COMMIT");
    if let Err(e) = s.client.batch_execute(&create) {
        rollback(s);
        // Another sidecar may have created it meanwhile (CREATE ... IF NOT EXISTS races).
        if !exists(s).unwrap_or(false) {
            tracing::error!(error = %e, table,
                "a Ferry table is missing and cannot be created; create it, or grant CREATE");
            return Err(Failure::from(e));
        }
    }
    Ok(())
}

/// Adds `column` to a table made by an earlier version that lacks it (the nonce table before
/// it kept write outcomes), when the role may; otherwise says what to run.
pub(in crate::store) fn ensure_column(
    s: &mut PgSession,
    table: &str,
    column: &str,
    ty: &str,
) -> Result<(), Failure> {
    let has = s
        .client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
             AND attname = $2 AND NOT attisdropped)",
            &[&table, &column],
        )
        .map(|r| r.get::<_, bool>(0))
        .map_err(Failure::from)?;
    if has {
        return Ok(());
    }
    let alter = format!(
        "BEGIN READ WRITE; ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {ty}; COMMIT"
    );
    if let Err(e) = s.client.batch_execute(&alter) {
        rollback(s);
        tracing::error!(error = %e, table, column,
            "a Ferry table lacks a column and it cannot be added: run ALTER TABLE {table} ADD COLUMN {column} {ty}");
        return Err(Failure::from(e));
    }
    Ok(())
}

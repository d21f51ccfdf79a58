//! The control session: the prerequisites, the publication, the slot, and the watched tables'
//! definitions (DDL is not in the stream). Its own Postgres connection, outside the pool.
//!
//! Which sidecar consumes is decided by the slot itself: Postgres lets one connection at a
//! time stream from it, and only a role with REPLICATION can. An advisory lock did this
//! before; its key could be computed, and any request's SQL could take it (a request that
//! held it past a restart left no sidecar able to lead, and every cached read bypassed).

use super::session::Session;
use crate::config::{ChangesConfig, Config};
use crate::store::postgres::{pg_async_config, pg_tls};
use std::collections::BTreeMap;
use tokio_postgres::Client;

/// A missing prerequisite, named so an operator can fix it (see RELIABILITY.md's setup).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot connect to postgres: {0}")]
    Connect(String),
    #[error("changes.enabled needs wal_level = logical on the server (it is {0}); set it in postgresql.conf (or the managed service's logical replication flag) and restart Postgres")]
    WalLevel(String),
    #[error("changes.enabled needs a role with REPLICATION (or the managed service's replication role, e.g. rds_replication); {0:?} has neither: ALTER ROLE {0} REPLICATION")]
    NotReplication(String),
    #[error("changes: watched table {0} does not exist (declared in [queries]/[keyspaces]/changes.tables)")]
    NoTable(String),
    #[error("changes: {0}")]
    Postgres(String),
}

fn pg(e: tokio_postgres::Error) -> SetupError {
    // The server's own message (a missing privilege, say) tells the operator what to fix.
    SetupError::Postgres(
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string()),
    )
}

/// Opens the control session (writes allowed: it creates the slot and emits the stream's
/// marks; no statement timeout: creating a slot waits for running transactions).
pub(super) async fn connect(config: &Config) -> Result<Client, SetupError> {
    let mut pg_config = pg_async_config(config).map_err(|e| SetupError::Connect(e.to_string()))?;
    pg_config.application_name("ferry-changes");
    // synchronous_commit=local: a mark is flushed as it commits, so the WAL sender (which
    // streams only flushed WAL) sends it at once, whatever the server's default.
    // After the pinned settings: a later -c of the same name wins.
    // force_generic_plan: the heartbeat's statements are prepared once (`session.rs`), and a
    // custom plan (Postgres's choice for the definitions) planned them again every time.
    pg_config.options(format!(
        "{} -c default_transaction_read_only=off -c statement_timeout=0 \
         -c synchronous_commit=local -c plan_cache_mode=force_generic_plan",
        crate::store::postgres::PINNED
    ));
    let tls = pg_tls(&config.postgres).map_err(SetupError::Connect)?;
    let (client, conn) = pg_config
        .connect(tls)
        .await
        .map_err(|e| SetupError::Connect(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "change stream control session closed");
        }
    });
    Ok(client)
}

/// What `changes.enabled` needs from the server and the role, checked at startup so a missing
/// one stops the sidecar with its name rather than leaving reads to bypass forever.
pub(super) async fn check(client: &Client, watched: &[String]) -> Result<(), SetupError> {
    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(pg)?
        .get(0);
    if level != "logical" {
        return Err(SetupError::WalLevel(level));
    }
    // RDS grants replication through membership in rds_replication, not the attribute.
    let row = client
        .query_one(
            "SELECT current_user::text, rolreplication OR rolsuper OR EXISTS ( \
               SELECT 1 FROM pg_roles r WHERE r.rolname = 'rds_replication' \
               AND pg_has_role(current_user, r.oid, 'member')) \
             FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(pg)?;
    if !row.get::<_, bool>(1) {
        return Err(SetupError::NotReplication(row.get(0)));
    }
    for t in watched {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[t])
            .await
            .map_err(pg)?
            .get(0);
        if !exists {
            return Err(SetupError::NoTable(t.clone()));
        }
    }
    Ok(())
}

/// Whether no connection streams from the slot now (a missing slot is free too: the one who
/// leads makes it). Two sidecars may both find it free; the slot then takes one of them, and
/// the other follows ([`slot_taken`]).
pub(super) async fn slot_free(s: &Session, c: &ChangesConfig) -> Result<bool, SetupError> {
    Ok(s.query_one(
        "SELECT NOT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), \
             false)",
        &[&c.slot],
    )
    .await
    .map_err(pg)?
    .get(0))
}

/// Whether a refusal to stream (or to make the slot) says that another sidecar got there
/// first: then this one follows.
pub(super) fn slot_taken(message: &str) -> bool {
    message.contains("is active for PID") || message.contains("already exists")
}

/// What the publication no longer covers of what the watched tables need: tables it lacks or
/// publishes through a row filter (Postgres 15: `ADD TABLE t WHERE (...)`; a change to a row
/// outside it, old and new, never reaches the stream), and operations it does not publish
/// (`ALTER PUBLICATION ... SET (publish = ...)`). Empty: every change reaches the stream.
pub(super) async fn uncovered(
    s: &Session,
    c: &ChangesConfig,
    watched: &[String],
) -> Result<Vec<String>, SetupError> {
    let row = s
        .query_opt(
            // `rowfilter` is read through `to_jsonb`: Postgres 14 has no such column. One scan
            // of `pg_publication_tables` for both lists: it is the dearest part of a heartbeat.
            "SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, \
                    coalesce(x.tables, '{}'), coalesce(x.filtered, '{}') \
             FROM pg_publication p, LATERAL ( \
               SELECT array_agg(t.schemaname || '.' || t.tablename) AS tables, \
                      array_agg(t.schemaname || '.' || t.tablename) \
                        FILTER (WHERE to_jsonb(t) ->> 'rowfilter' IS NOT NULL) AS filtered \
               FROM pg_publication_tables t WHERE t.pubname = p.pubname) x \
             WHERE p.pubname = $1",
            &[&c.publication],
        )
        .await
        .map_err(pg)?;
    let Some(row) = row else {
        return Ok(vec![format!("the publication {}", c.publication)]);
    };
    let mut missing: Vec<String> = ["insert", "update", "delete", "truncate"]
        .iter()
        .enumerate()
        .filter(|(i, _)| !row.get::<_, bool>(*i))
        .map(|(_, op)| format!("{op} (publish)"))
        .collect();
    let (present, filtered): (Vec<String>, Vec<String>) = (row.get(4), row.get(5));
    for t in watched {
        if !present.contains(t) {
            missing.push(t.clone());
        } else if filtered.contains(t) {
            missing.push(format!("{t} (published through a row filter)"));
        }
    }
    // A read of a table reads its inheritance children's rows too: a child the publication
    // lacks (one that began inheriting after the table was added), or the stream does not
    // watch (its changes name no entry), changes them unseen. Partitions are published
    // through their root, or the root itself is missing above.
    let children = s
        .query(
            "WITH RECURSIVE d(oid) AS ( \
               SELECT i.inhrelid FROM pg_inherits i \
                 WHERE i.inhparent IN (SELECT to_regclass(t) FROM unnest($1::text[]) AS t) \
               UNION SELECT i.inhrelid FROM pg_inherits i JOIN d ON i.inhparent = d.oid) \
             SELECT n.nspname || '.' || k.relname FROM d JOIN pg_class k ON k.oid = d.oid \
               JOIN pg_namespace n ON n.oid = k.relnamespace WHERE NOT k.relispartition",
            &[&watched],
        )
        .await
        .map_err(pg)?;
    for child in children.iter().map(|r| r.get::<_, String>(0)) {
        if !present.contains(&child) {
            missing.push(format!("{child} (inherits a watched table)"));
        } else if !watched.contains(&child) {
            missing.push(format!(
                "{child} (inherits a watched table: add it to changes.tables)"
            ));
        }
    }
    Ok(missing)
}

/// Makes sure the publication covers the watched tables and the slot exists and is usable.
/// Returns true when the slot is new (created now, or re-created after Postgres invalidated
/// it): what changed before it is unknown, so everything cached must go.
pub(super) async fn prepare(
    client: &Client,
    c: &ChangesConfig,
    watched: &[String],
) -> Result<bool, SetupError> {
    // Names are checked identifiers (config validation), safe to splice into DDL.
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&c.publication],
        )
        .await
        .map_err(pg)?
        .is_some();
    if !exists {
        let ddl = format!(
            "CREATE PUBLICATION {} FOR TABLE {}",
            c.publication,
            watched.join(", ")
        );
        client.batch_execute(&ddl).await.map_err(pg)?;
        tracing::info!(publication = %c.publication, tables = ?watched, "created the publication");
    } else {
        let rows = client
            .query(
                "SELECT schemaname || '.' || tablename FROM pg_publication_tables \
                 WHERE pubname = $1",
                &[&c.publication],
            )
            .await
            .map_err(pg)?;
        let present: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let missing: Vec<&String> = watched.iter().filter(|t| !present.contains(t)).collect();
        if !missing.is_empty() {
            let ddl = format!(
                "ALTER PUBLICATION {} ADD TABLE {}",
                c.publication,
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            client.batch_execute(&ddl).await.map_err(pg)?;
            tracing::info!(publication = %c.publication, tables = ?missing, "added tables to the publication");
        }
    }
    let slot = client
        .query_opt(
            "SELECT plugin::text, coalesce(wal_status, '') FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&c.slot],
        )
        .await
        .map_err(pg)?;
    match slot {
        Some(row) if row.get::<_, String>(1) != "lost" => {
            let plugin: String = row.get(0);
            if plugin != "pgoutput" {
                return Err(SetupError::Postgres(format!(
                    "slot {} uses the {plugin} plugin, not pgoutput: drop it or set changes.slot",
                    c.slot
                )));
            }
            Ok(false)
        }
        lost => {
            if lost.is_some() {
                tracing::warn!(slot = %c.slot, "the slot was invalidated (max_slot_wal_keep_size): everything cached is dropped and the slot made anew");
                client
                    .execute("SELECT pg_drop_replication_slot($1)", &[&c.slot])
                    .await
                    .map_err(pg)?;
            }
            client
                .execute(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&c.slot],
                )
                .await
                .map_err(pg)?;
            // What the new slot owes (everything cached dropped) goes into its own stream, so
            // whichever session consumes it first (this one, a later one, another sidecar's)
            // flushes before it confirms past it: the session that made the slot may end
            // before its own flush, and the next one finds the slot already there. Not written:
            // the slot goes again, so the next session makes it anew and owes the flush again.
            if let Err(e) = client.execute(OWED_FLUSH, &[]).await {
                let _ = client
                    .execute("SELECT pg_drop_replication_slot($1)", &[&c.slot])
                    .await;
                return Err(pg(e));
            }
            tracing::info!(slot = %c.slot, "created the replication slot");
            Ok(true)
        }
    }
}

/// Each watched table's definition, hashed: what a read of it returns besides its rows. Its
/// columns and types, an enum column's labels (`ALTER TYPE ... RENAME VALUE` changes them under
/// every row), its storage (TRUNCATE and table rewrites replace it), and who may read which of
/// its rows: privileges (table and column), row-level security and its policies, and its
/// inheritance parents and children with their partition bounds (an attacker's review found
/// `ENABLE ROW LEVEL SECURITY`, `REVOKE SELECT` and `INHERIT` served from entries made before
/// them). None for a table that no longer exists.
pub(super) async fn definitions(
    s: &Session,
    watched: &[String],
) -> Result<BTreeMap<String, Option<String>>, SetupError> {
    let rows = s
        .query(
            "SELECT t, (SELECT md5(concat_ws('|', c.relfilenode::text, \
                 (SELECT string_agg(a.attname || ' ' || a.atttypid || ' ' || a.atttypmod \
                    || ' ' || coalesce(a.attacl::text, '') || coalesce((SELECT \
                    string_agg(e.enumlabel, '|' ORDER BY e.enumsortorder) FROM pg_enum e \
                    WHERE e.enumtypid = a.atttypid), ''), ',' ORDER BY a.attnum) \
                  FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 \
                    AND NOT a.attisdropped), \
                 c.relrowsecurity::text || c.relforcerowsecurity::text, \
                 coalesce(c.relacl::text, ''), \
                 coalesce((SELECT string_agg(p.polname || ' ' || p.polcmd::text || ' ' \
                    || p.polpermissive::text || ' ' || p.polroles::text || ' ' \
                    || coalesce(pg_get_expr(p.polqual, p.polrelid), '') || ' ' \
                    || coalesce(pg_get_expr(p.polwithcheck, p.polrelid), ''), ',' \
                    ORDER BY p.polname) FROM pg_policy p WHERE p.polrelid = c.oid), ''), \
                 coalesce((SELECT string_agg(i.inhrelid::text || ' ' \
                    || coalesce(pg_get_expr(k.relpartbound, k.oid), ''), ',' \
                    ORDER BY i.inhrelid) FROM pg_inherits i JOIN pg_class k \
                    ON k.oid = i.inhrelid WHERE i.inhparent = c.oid), ''), \
                 coalesce((SELECT string_agg(i.inhparent::text, ',' ORDER BY i.inhparent) \
                    FROM pg_inherits i WHERE i.inhrelid = c.oid), ''))) \
               FROM pg_class c WHERE c.oid = to_regclass(t)) \
             FROM unnest($1::text[]) AS t",
            &[&watched],
        )
        .await
        .map_err(pg)?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The message a new slot's stream starts with: everything cached is dropped before anything
/// after it is confirmed (`stream.rs`). Transactional, like a mark.
pub(super) const FLUSH_PREFIX: &str = "ferry.flush";
const OWED_FLUSH: &str = "SELECT pg_logical_emit_message(true, 'ferry.flush', '')";

/// Writes a mark into the WAL. Transactional: it is decoded at its commit, after every commit
/// before it, and its commit flushes the WAL (a non-transactional message waits for the next
/// flush: up to `wal_writer_delay` on an idle server before Postgres 17).
pub(super) async fn mark(s: &Session, mark_ms: u64) -> Result<(), SetupError> {
    s.query(
        "SELECT pg_logical_emit_message(true, 'ferry.mark', $1)",
        &[&mark_ms.to_string()],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

/// Bytes of WAL the slot holds back (what it costs the database's disk).
pub(super) async fn slot_lag_bytes(
    s: &Session,
    c: &ChangesConfig,
) -> Result<Option<i64>, SetupError> {
    Ok(s.query_opt(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
        &[&c.slot],
    )
    .await
    .map_err(pg)?
    .and_then(|r| r.get(0)))
}

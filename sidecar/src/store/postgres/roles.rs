//! Trust levels are Postgres roles, checked before anything is served.
//!
//! Requests run SQL that Ferry cannot read (functions, DO blocks, dynamic SQL), so what a
//! request may do is what its role may do. Ferry keeps four apart:
//! - Ferry's own role (`postgres.owner_url`): it owns the schema of Ferry's books (write
//!   outcomes and replay nonces, deferred invalidations); no request runs as it;
//! - the requests' role (`postgres.url`): named queries and raw `/v1` SQL;
//! - each Neon token's role (`neon.tokens[].postgres_url`): any SQL its holder sends;
//! - end users' roles (`identity.roles`), taken on for one request by the requests' role.
//!
//! The audit refuses, naming the role and the fix, any request or token role that could touch
//! Ferry's books (write them, own their schema, create in it, be Ferry's role or a member of
//! it, be a superuser, read every session's statements), a Neon token role that holds an end user's role (it could act as any
//! user), and a read-only token whose role may write large objects (`lo_from_bytea` and
//! friends write even in a read-only transaction), or that may write WAL messages
//! (`pg_logical_emit_message`, executable by everyone by default): a read-only token could
//! fill the database's disk with them, and with the change stream on, any request role could
//! forge its freshness marks and keep stale cache entries served. `postgres.single_role`
//! skips it: then one role does everything, as the operator chose.

use tokio_postgres::Client;

/// What the audit checks, from the config (all names validated identifiers or role names).
#[derive(Debug, Clone, Default)]
pub(crate) struct Audit {
    /// Ferry's own role.
    pub owner: String,
    /// The schema and tables of Ferry's books.
    pub schemas: Vec<String>,
    pub tables: Vec<String>,
    /// Roles requests run as, each with what names it in the config and whether it may only
    /// read: `postgres.url`'s, and each Neon token's.
    pub requests: Vec<RequestRole>,
    /// `identity.roles`.
    pub identity: Vec<String>,
    /// The change stream is on: its marks must be the stream's alone.
    pub changes: bool,
    /// `identity.allow_raw_sql`: the operator trusts raw SQL's authors with end users' roles,
    /// so a token's role may hold them (the Neon driver's `authToken` needs it to).
    pub raw_sql_as_users: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct RequestRole {
    pub role: String,
    /// The config key that names it (`postgres.url`, `neon.tokens[0].postgres_url`).
    pub key: String,
    /// A Neon token: it runs any SQL, so it may not hold an end user's role.
    pub token: bool,
    pub read_only: bool,
}

impl Audit {
    /// From the config; None with `postgres.single_role` (or when there are no books and no
    /// tokens to keep apart).
    pub(crate) fn for_config(config: &crate::config::Config) -> Option<Audit> {
        use crate::store::postgres::login_role;
        if config.postgres.single_role {
            return None;
        }
        let mut requests = vec![RequestRole {
            role: login_role(&config.postgres.url).unwrap_or_default(),
            key: "postgres.url".into(),
            token: false,
            read_only: false,
        }];
        for (i, t) in config.neon.tokens.iter().enumerate() {
            requests.push(RequestRole {
                role: login_role(&t.postgres_url).unwrap_or_default(),
                key: format!("neon.tokens[{i}].postgres_url"),
                token: true,
                read_only: t.read_only,
            });
        }
        let mut tables = Vec::new();
        if config.auth.replay == crate::config::ReplayScope::Shared {
            tables.extend(crate::config::table_name(&config.auth.nonce_table));
        }
        tables.extend(crate::config::table_name(&config.cache.deferred_table));
        let mut schemas: Vec<String> = tables
            .iter()
            .filter_map(|t| t.split_once('.').map(|(s, _)| s.to_string()))
            .collect();
        schemas.dedup();
        Some(Audit {
            owner: login_role(&config.postgres.owner_url).unwrap_or_default(),
            schemas,
            tables,
            requests,
            identity: config.identity.roles.clone(),
            changes: config.changes.enabled,
            raw_sql_as_users: config.identity.allow_raw_sql,
        })
    }
}

/// The large-object functions that write, even in a read-only transaction.
const LO_WRITERS: [&str; 10] = [
    "lo_creat(integer)",
    "lo_create(oid)",
    "lo_from_bytea(oid,bytea)",
    "lo_import(text)",
    "lo_import(text,oid)",
    "lo_put(oid,bigint,bytea)",
    "lo_unlink(oid)",
    "lo_truncate(integer,integer)",
    "lo_truncate64(integer,bigint)",
    "lowrite(integer,bytea)",
];

/// The functions that write WAL messages, even in a read-only transaction (the last one is
/// Postgres 17's).
const EMITTERS: [&str; 3] = [
    "pg_logical_emit_message(boolean,text,bytea)",
    "pg_logical_emit_message(boolean,text,text)",
    "pg_logical_emit_message(boolean,text,text,boolean)",
];

/// Why the audit did not pass.
pub(crate) enum Refusal {
    /// Its query got no answer (a lost connection, a timeout, a lock): nothing was judged,
    /// so it is asked again, never taken for a verdict (`not_answered`).
    NotAsked(tokio_postgres::Error),
    /// What is wrong, naming the key and the fix.
    Unsafe(String),
}

/// A failed audit query: one that got no answer this time (cancelled by a timeout or a lock,
/// a lost connection, a server shutting down) is asked again; any other error would come back
/// every time (a privilege, a catalog, a proxy), and refuses, naming it, as at startup.
fn not_answered(e: tokio_postgres::Error) -> Refusal {
    use tokio_postgres::error::SqlState;
    let again = match e.code() {
        None => true,
        Some(c) => {
            let class = c.code().get(..2);
            class == Some("08")
                || class == Some("57")
                || [
                    SqlState::LOCK_NOT_AVAILABLE,
                    SqlState::T_R_DEADLOCK_DETECTED,
                ]
                .contains(c)
        }
    };
    if again {
        return Refusal::NotAsked(e);
    }
    Refusal::Unsafe(format!(
        "the roles could not be checked: {}",
        crate::store::postgres::failure::describe(&e)
    ))
}

/// Runs the audit on any session: it reads only the catalogs (by oid: a schema the session's
/// role may not use is never looked up by name) and the `has_*_privilege` functions, which
/// answer for any role.
pub(crate) async fn audit(client: &Client, a: &Audit) -> Result<(), Refusal> {
    let mut seen: Vec<&str> = Vec::new();
    for r in &a.requests {
        if r.role.is_empty() {
            return Err(Refusal::Unsafe(format!(
                "{}: name the login role (postgres://ROLE@host/db)",
                r.key
            )));
        }
        if r.role == a.owner {
            return Err(Refusal::Unsafe(format!(
                "{} connects as {:?}, Ferry's own role (postgres.owner_url): requests must never \
                 run as the role that keeps Ferry's books",
                r.key, r.role
            )));
        }
        if seen.contains(&r.role.as_str()) {
            return Err(Refusal::Unsafe(format!(
                "{} connects as {:?}, which another token or postgres.url already uses: give \
                 each Neon token a role of its own (one role's sessions can read each other's \
                 statements in pg_stat_activity and end each other with pg_terminate_backend)",
                r.key, r.role
            )));
        }
        seen.push(&r.role);
        let row = client
            .query_opt(
                // Every role the login role may become counts (`m`: itself and each role it is
                // a member of, inherited or not): a NOINHERIT role's SQL can SET ROLE to any of
                // them, so their privileges are its privileges.
                "WITH r AS (SELECT oid FROM pg_roles WHERE rolname = $1), \
                      m AS (SELECT x.oid, x.rolsuper FROM pg_roles x, r \
                            WHERE pg_has_role(r.oid, x.oid, 'MEMBER')) \
                 SELECT EXISTS (SELECT 1 FROM m WHERE m.rolsuper), \
                   EXISTS (SELECT 1 FROM pg_roles o WHERE o.rolname = $2 \
                           AND pg_has_role(r.oid, o.oid, 'MEMBER')), \
                   EXISTS (SELECT 1 FROM pg_namespace n, m WHERE n.nspname = ANY($3) \
                           AND (has_schema_privilege(m.oid, n.oid, 'CREATE') \
                                OR m.oid = n.nspowner)), \
                   EXISTS (SELECT 1 FROM pg_class c \
                           JOIN pg_namespace n ON n.oid = c.relnamespace, m \
                           WHERE n.nspname || '.' || c.relname = ANY($4) \
                             AND has_table_privilege(m.oid, c.oid, \
                                   'INSERT, UPDATE, DELETE, TRUNCATE')), \
                   ARRAY(SELECT i FROM unnest($5::text[]) i \
                         WHERE EXISTS (SELECT 1 FROM pg_roles x WHERE x.rolname = i \
                                       AND pg_has_role(r.oid, x.oid, 'MEMBER'))), \
                   ARRAY(SELECT f FROM unnest($6::text[]) f \
                         WHERE to_regprocedure(f) IS NOT NULL \
                           AND EXISTS (SELECT 1 FROM m \
                                       WHERE has_function_privilege(m.oid, f, 'EXECUTE'))), \
                   ARRAY(SELECT f FROM unnest($7::text[]) f \
                         WHERE to_regprocedure(f) IS NOT NULL \
                           AND EXISTS (SELECT 1 FROM m \
                                       WHERE has_function_privilege(m.oid, f, 'EXECUTE'))), \
                   pg_has_role(r.oid, 'pg_read_all_stats', 'MEMBER') \
                 FROM r",
                &[
                    &r.role,
                    &a.owner,
                    &a.schemas,
                    &a.tables,
                    &a.identity,
                    &&LO_WRITERS[..],
                    &&EMITTERS[..],
                ],
            )
            .await
            .map_err(not_answered)?;
        let Some(row) = row else {
            return Err(Refusal::Unsafe(format!(
                "{}: role {:?} does not exist",
                r.key, r.role
            )));
        };
        let (superuser, member_of_owner, schema, tables): (bool, bool, bool, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let identity: Vec<String> = row.get(4);
        let lo: Vec<String> = row.get(5);
        let emit: Vec<String> = row.get(6);
        let all_stats: bool = row.get(7);
        let problem = if superuser {
            Some(
                "is a superuser, or may become one (SET ROLE): it can do anything, Ferry's \
                 books included"
                    .to_string(),
            )
        } else if member_of_owner {
            Some(format!("is a member of Ferry's own role {:?}", a.owner))
        } else if schema {
            Some(format!(
                "may create in (or owns) the schema of Ferry's books ({}); REVOKE CREATE ON \
                 SCHEMA ... FROM it, and let Ferry's role own the schema",
                a.schemas.join(", ")
            ))
        } else if tables {
            Some(format!(
                "may write Ferry's books ({}); REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON them",
                a.tables.join(", ")
            ))
        } else if all_stats {
            Some(
                "is a member of pg_read_all_stats (or pg_monitor): it reads every session's \
                 statements in pg_stat_activity, Ferry's own calls and their proofs included; \
                 REVOKE it"
                    .to_string(),
            )
        } else if r.token && !identity.is_empty() && !a.raw_sql_as_users {
            Some(format!(
                "holds the end users' role(s) {identity:?}: a token's SQL could SET ROLE and act \
                 as any user; REVOKE them from it (or, to run the Neon driver's authToken as \
                 end users, trust raw SQL's authors with identity.allow_raw_sql = true)"
            ))
        } else if r.read_only && !lo.is_empty() {
            Some(format!(
                "belongs to a read-only token but may run {} (large objects are written even in \
                 a read-only transaction); REVOKE EXECUTE ON FUNCTION ... FROM PUBLIC (and from \
                 it), as scripts/demo.sql does",
                lo.join(", ")
            ))
        } else if !emit.is_empty() && (r.read_only || a.changes) {
            Some(format!(
                "may run pg_logical_emit_message ({}): {}; REVOKE EXECUTE ON FUNCTION ... FROM \
                 PUBLIC and GRANT it to the change stream's role, as scripts/demo.sql does",
                if r.read_only {
                    "it writes WAL even in a read-only transaction"
                } else {
                    "it could forge the change stream's freshness marks"
                },
                emit.join(", ")
            ))
        } else {
            None
        };
        if let Some(p) = problem {
            return Err(Refusal::Unsafe(format!(
                "{} connects as {:?}, which {p}",
                r.key, r.role
            )));
        }
    }
    Ok(())
}

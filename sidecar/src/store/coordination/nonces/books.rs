//! Ferry's books in Postgres: the nonce table, kept by Ferry's own role (`postgres.owner_url`),
//! and the one door requests have to it.
//!
//! A write records its nonce inside its own transaction, on the request's session, so the row
//! commits exactly when the write does. The request's role may not touch the table: it could
//! then insert rows for writes never sent (`/v1/outcome` would answer "committed"), delete the
//! fence of one reported "not committed", or refuse another caller's write as a replay. So the
//! row goes in through one function, `ferry_record_write`, owned by Ferry's role (`SECURITY
//! DEFINER`), which the request role may only call; and the function asks for a proof that
//! Ferry sent the call: `sha256(key || nonce)`, where the key is 32 random bytes in a table
//! only Ferry's role can read. A caller's SQL can call the function, but cannot write a row for
//! any nonce it was not handed a proof for (and proofs travel only in Ferry's own calls, bound
//! as parameters).
//!
//! Ferry's role makes all of it when missing (the schema too, when it may), then grants the
//! request role USAGE on the schema and EXECUTE on the function, nothing else.

use crate::store::coordination::ferry_tables;
use crate::store::pools::session::rollback;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::PgSession;
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex, OnceLock};

/// The nonce table's columns. `rows_affected` is NULL for a write that did not commit (or was
/// fenced).
const COLUMNS: &str =
    "(nonce bytea PRIMARY KEY, expires_at timestamptz NOT NULL, rows_affected bigint)";

/// Where the books are, and the key once read.
#[derive(Debug)]
pub(crate) struct Books {
    /// `auth.nonce_table`, validated (`schema.table`, unquoted identifiers).
    pub table: String,
    /// Its schema, where the key table and the function live too.
    schema: String,
    /// The role requests run as (`postgres.url`'s), granted EXECUTE on the function.
    grantee: Option<String>,
    key: OnceLock<[u8; 32]>,
    /// Held while this sidecar makes the books: one thread makes them, the others wait.
    making: Mutex<()>,
}

impl Books {
    pub(crate) fn new(table: &str, grantee: Option<String>) -> Arc<Books> {
        let schema = table
            .split_once('.')
            .map_or("public", |(s, _)| s)
            .to_string();
        Arc::new(Books {
            table: table.to_string(),
            schema,
            grantee,
            key: OnceLock::new(),
            making: Mutex::new(()),
        })
    }

    /// The function requests call, with its argument types (what `to_regprocedure` takes).
    fn function(&self) -> String {
        format!(
            "{}.ferry_record_write(bytea, integer, bigint, bytea, boolean)",
            self.schema
        )
    }

    /// Whether the key is known (the books were made sure of).
    pub(crate) fn ready(&self) -> bool {
        self.key.get().is_some()
    }

    /// The proof for `nonce` (hex of its 16 bytes), once the key is known.
    pub(crate) fn proof(&self, nonce_hex: &str) -> Option<String> {
        let key = self.key.get()?;
        let nonce = hex::decode(nonce_hex).ok()?;
        let mut h = Sha256::new();
        h.update(key);
        h.update(&nonce);
        Some(hex::encode(h.finalize()))
    }

    /// The call that records `nonce_hex` (with a proof) as a write that affected `rows` (None:
    /// did not commit); `if_absent`: a row already there is left as it is.
    pub(crate) fn record_call(
        &self,
        nonce_hex: &str,
        keep_s: u64,
        rows: Option<u64>,
        if_absent: bool,
    ) -> Option<String> {
        // Only our own hex and numbers and a validated name are spliced in (decode: no
        // backslash, whatever standard_conforming_strings says).
        Some(format!(
            "SELECT {}.ferry_record_write(decode('{nonce_hex}', 'hex'), {keep_s}, {}, \
             decode('{}', 'hex'), {if_absent})",
            self.schema,
            rows.map_or("NULL".to_string(), |n| n.to_string()),
            self.proof(nonce_hex)?
        ))
    }

    /// Makes sure of everything on a session of Ferry's own role, and reads the key. A failure
    /// is the operator's to fix (the log says what), never the caller's: Err, nothing is
    /// marked ready, and the next write tries again.
    ///
    /// Several threads (the sweeper, each first write) and several sidecars may get here at
    /// once. Within a sidecar one makes the books and the others wait for it; across sidecars,
    /// the function and the grants are made under a lock of the key table, each checked after
    /// the lock is held. Without that, a `CREATE OR REPLACE` of one sidecar could make another's
    /// GRANT fail ("tuple concurrently updated"), and a write go ahead before the request role
    /// could call the function: "permission denied for schema ferry".
    pub(in crate::store) fn make_sure(&self, s: &mut PgSession) -> Result<(), Failure> {
        if self.ready() {
            return Ok(());
        }
        let _one_at_a_time = self.making.lock().unwrap_or_else(|p| p.into_inner());
        if self.ready() {
            return Ok(());
        }
        ferry_tables::ensure(s, &self.table, COLUMNS)?;
        ferry_tables::ensure_column(s, &self.table, "rows_affected", "bigint")?;
        let key_table = format!("{}.ferry_write_key", self.schema);
        ferry_tables::ensure(
            s,
            &key_table,
            "(one boolean PRIMARY KEY DEFAULT true CHECK (one), key bytea NOT NULL)",
        )?;
        let fresh: [u8; 32] = rand::random();
        let made = in_transaction(s, |s| {
            // Not an advisory lock: any request's SQL may take one by its number and hold
            // every maker back. Only Ferry's role may lock its key table.
            s.client.batch_execute(&format!(
                "LOCK TABLE {key_table} IN SHARE ROW EXCLUSIVE MODE"
            ))?;
            s.client.execute(
                &format!("INSERT INTO {key_table} (key) VALUES ($1) ON CONFLICT DO NOTHING"),
                &[&fresh.as_slice()],
            )?;
            let key: Vec<u8> = s
                .client
                .query_one(&format!("SELECT key FROM {key_table}"), &[])?
                .get(0);
            self.make_function(s, &key_table)?;
            if let Some(role) = &self.grantee {
                self.grant(s, role)?;
            }
            Ok(key)
        });
        let key = match made {
            Ok(key) => key,
            // A session lost is no one's to fix: the caller may take another.
            Err(f @ Failure::Closed(_)) => return Err(f),
            Err(f) => {
                tracing::error!(error = %f.into_api(), function = %self.function(),
                    grantee = ?self.grantee,
                    "Ferry's books were not made (the next write tries again); if this \
                     repeats, give Ferry's role CREATE on the schema, or make the function and \
                     grant the request role USAGE and EXECUTE");
                return Err(Failure::Api(crate::error::ApiError::internal(
                    "Ferry's books are not usable",
                )));
            }
        };
        let key: [u8; 32] = key
            .try_into()
            .map_err(|_| Failure::Api(crate::error::ApiError::internal("bad write key")))?;
        let _ = self.key.set(key);
        Ok(())
    }

    /// The record function, unless it is there (inside `make_sure`'s locked transaction).
    fn make_function(&self, s: &mut PgSession, key_table: &str) -> Result<(), Failure> {
        let has_function: bool = s
            .client
            .query_one(
                "SELECT to_regprocedure($1) IS NOT NULL",
                &[&self.function()],
            )?
            .get(0);
        if has_function {
            return Ok(());
        }
        let body = format!(
            "CREATE FUNCTION {schema}.ferry_record_write(p_nonce bytea, \
               p_keep_s integer, p_rows bigint, p_proof bytea, p_if_absent boolean) \
             RETURNS void LANGUAGE plpgsql SECURITY DEFINER \
             SET search_path = pg_catalog, pg_temp AS $ferry$ \
             BEGIN \
               IF p_proof IS DISTINCT FROM sha256((SELECT key FROM {key_table}) || p_nonce) \
               THEN RAISE EXCEPTION 'ferry_record_write: not a write of Ferry''s' \
                    USING ERRCODE = 'insufficient_privilege'; \
               END IF; \
               IF p_if_absent THEN \
                 INSERT INTO {table} (nonce, expires_at, rows_affected) VALUES (p_nonce, \
                   now() + make_interval(secs => p_keep_s), p_rows) \
                 ON CONFLICT (nonce) DO NOTHING; \
               ELSE \
                 INSERT INTO {table} (nonce, expires_at, rows_affected) VALUES (p_nonce, \
                   now() + make_interval(secs => p_keep_s), p_rows); \
               END IF; \
             END $ferry$; \
             REVOKE ALL ON FUNCTION {function} FROM PUBLIC",
            schema = self.schema,
            table = self.table,
            function = self.function(),
        );
        Ok(s.client.batch_execute(&body)?)
    }

    /// USAGE on the schema and EXECUTE on the function for the request role, unless it has
    /// them (inside `make_sure`'s locked transaction).
    fn grant(&self, s: &mut PgSession, role: &str) -> Result<(), Failure> {
        let has: bool = s
            .client
            .query_one(
                "SELECT has_schema_privilege($1, $2, 'USAGE') \
                   AND has_function_privilege($1, $3, 'EXECUTE')",
                &[&role, &self.schema, &self.function()],
            )?
            .get(0);
        if has {
            return Ok(());
        }
        let grants = format!(
            "GRANT USAGE ON SCHEMA {} TO \"{role}\"; GRANT EXECUTE ON FUNCTION {} TO \"{role}\"",
            self.schema,
            self.function()
        );
        Ok(s.client.batch_execute(&grants)?)
    }
}

/// `work` in a read-write transaction of its own (sessions start read-only).
fn in_transaction<T>(
    s: &mut PgSession,
    work: impl FnOnce(&mut PgSession) -> Result<T, Failure>,
) -> Result<T, Failure> {
    s.client.batch_execute("BEGIN READ WRITE")?;
    match work(s) {
        Ok(v) => {
            s.client.batch_execute("COMMIT")?;
            Ok(v)
        }
        Err(f) => {
            rollback(s);
            Err(f)
        }
    }
}

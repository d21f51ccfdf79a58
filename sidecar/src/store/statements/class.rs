//! What kind of statement a caller sent, decided before it reaches Postgres.
//!
//! Pooled connections are shared by every caller in turn, so statements whose effect outlives
//! the request (transaction control, session settings, cursors, prepared statements, LISTEN,
//! temp tables, locks) are refused up front with a 400 naming their class. This is the first
//! line only: functions (`set_config`, `pg_advisory_lock`...) change the session too and no
//! text check sees them, so every connection is also reset after each use (`pooled.rs`), and reads
//! run in read-only transactions, which Postgres itself enforces.
//!
//! The check reads only the leading keywords, after comments and opening parentheses, the way
//! Postgres' own grammar starts; one statement per request is guaranteed separately, because
//! statements are sent with the extended protocol, which refuses more than one.

use crate::error::ApiError;

/// Where a statement is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/v1/query` and batches: must be a query, and runs read-only.
    Read,
    /// `/v1/execute`: anything that does not control the transaction or change the session.
    Write,
}

/// Why a statement is refused; the text is the class named in the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    TransactionControl,
    SessionState,
    Copy,
    NotARead,
    /// DO and CALL for a read-only caller: procedural code that may end the read-only
    /// transaction it was given (a DO block's COMMIT) or write through a function.
    Procedural,
    /// Roles and server-wide settings (ALTER ROLE ... SET, ALTER SYSTEM): they outlive the
    /// request and every session of the role, restarts included.
    Roles,
}

impl Refusal {
    pub(crate) fn class(self) -> &'static str {
        match self {
            Refusal::TransactionControl => "transaction control",
            Refusal::SessionState => "session state",
            Refusal::Copy => "COPY",
            Refusal::NotARead => "not a read",
            Refusal::Procedural => "procedural code",
            Refusal::Roles => "roles and server settings",
        }
    }

    fn advice(self) -> &'static str {
        match self {
            Refusal::TransactionControl => {
                "each request runs in a transaction of its own; BEGIN, COMMIT, ROLLBACK, \
                 SAVEPOINT and PREPARE TRANSACTION are refused"
            }
            Refusal::SessionState => {
                "pooled connections are shared, so SET, RESET, DISCARD, LISTEN, LOAD, cursors, \
                 prepared statements, LOCK and temporary tables are refused"
            }
            Refusal::Copy => "COPY cannot run over this API; use INSERT or SELECT",
            Refusal::NotARead => {
                "reads must be SELECT, WITH, VALUES, TABLE or SHOW; send a write as one \
                 (/v1/execute; on /sql, without Ferry-Cache-TTL)"
            }
            Refusal::Procedural => "a read-only caller cannot run DO blocks or CALL procedures",
            Refusal::Roles => {
                "roles, databases and server settings are the operator's: CREATE/ALTER/DROP \
                 ROLE, USER, GROUP, DATABASE and ALTER SYSTEM are refused"
            }
        }
    }
}

/// Checks `sql` for `route`: Ok, or 400 `statement_not_allowed` naming the class.
pub(crate) fn check(sql: &str, route: Route) -> Result<(), ApiError> {
    match classify(sql, route) {
        None => Ok(()),
        Some(r) => Err(ApiError::StatementNotAllowed {
            class: r.class(),
            advice: r.advice(),
        }),
    }
}

/// [`check`], then, for a caller that may only read (a read-only token), DO and CALL refused
/// too. The read-only transaction it runs in is what Postgres enforces; this is the clear
/// answer in front of it.
pub(crate) fn check_read_only(sql: &str, route: Route) -> Result<(), ApiError> {
    check(sql, route)?;
    let first = Words::new(sql).next_upper().unwrap_or_default();
    if matches!(first.as_str(), "DO" | "CALL") {
        let r = Refusal::Procedural;
        return Err(ApiError::StatementNotAllowed {
            class: r.class(),
            advice: r.advice(),
        });
    }
    Ok(())
}

/// The refusal for `sql` on `route`, if any.
pub(crate) fn classify(sql: &str, route: Route) -> Option<Refusal> {
    let mut words = Words::new(sql);
    let first = words.next_upper().unwrap_or_default();
    let refusal = match first.as_str() {
        "BEGIN" | "START" | "COMMIT" | "END" | "ROLLBACK" | "ABORT" | "SAVEPOINT" | "RELEASE" => {
            Some(Refusal::TransactionControl)
        }
        "PREPARE" => {
            if words.next_upper().as_deref() == Some("TRANSACTION") {
                Some(Refusal::TransactionControl)
            } else {
                Some(Refusal::SessionState)
            }
        }
        "SET" | "RESET" | "DISCARD" | "LISTEN" | "UNLISTEN" | "LOAD" | "DECLARE" | "FETCH"
        | "MOVE" | "CLOSE" | "EXECUTE" | "DEALLOCATE" | "LOCK" => Some(Refusal::SessionState),
        "COPY" => Some(Refusal::Copy),
        "CREATE" | "ALTER" | "DROP" => match object(&mut words) {
            Object::Temp => Some(Refusal::SessionState),
            Object::Role => Some(Refusal::Roles),
            Object::Other => None,
        },
        _ => None,
    };
    if refusal.is_some() {
        return refusal;
    }
    match route {
        Route::Read
            if !matches!(
                first.as_str(),
                "SELECT" | "WITH" | "VALUES" | "TABLE" | "SHOW"
            ) =>
        {
            Some(Refusal::NotARead)
        }
        _ => None,
    }
}

/// What a CREATE, ALTER or DROP is about, as far as the refusals go.
enum Object {
    /// `CREATE [OR REPLACE] [GLOBAL | LOCAL] {TEMP | TEMPORARY} ...`
    Temp,
    /// ROLE, USER, GROUP, DATABASE, SYSTEM (`ALTER SYSTEM`).
    Role,
    Other,
}

fn object(words: &mut Words<'_>) -> Object {
    while let Some(w) = words.next_upper() {
        match w.as_str() {
            "OR" | "REPLACE" | "GLOBAL" | "LOCAL" => continue,
            "TEMP" | "TEMPORARY" => return Object::Temp,
            "ROLE" | "USER" | "GROUP" | "DATABASE" | "SYSTEM" => return Object::Role,
            _ => return Object::Other,
        }
    }
    Object::Other
}

/// The leading words of a statement, skipping white space, `--` and nested `/* */` comments,
/// and opening parentheses.
pub(crate) struct Words<'a> {
    rest: &'a str,
}

impl<'a> Words<'a> {
    pub(crate) fn new(sql: &'a str) -> Self {
        Words { rest: sql }
    }

    /// Whitespace, comments, `(` and `;`: Postgres drops empty statements, so `;COMMIT` is
    /// prepared as one statement, a COMMIT (an attacker's review: it ended a read-only
    /// token's transaction unchecked).
    fn skip_noise(&mut self) {
        loop {
            let s = self
                .rest
                .trim_start_matches(|c: char| c.is_whitespace() || c == '(' || c == ';');
            if let Some(after) = s.strip_prefix("--") {
                // Postgres's lexer ends a `--` comment at either line break (`\n` or `\r`).
                self.rest = after.split_once(['\n', '\r']).map_or("", |(_, r)| r);
            } else if s.starts_with("/*") {
                self.rest = skip_block_comment(s);
            } else {
                self.rest = s;
                return;
            }
        }
    }

    pub(crate) fn next_upper(&mut self) -> Option<String> {
        self.skip_noise();
        let end = self
            .rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(self.rest.len());
        if end == 0 {
            return None;
        }
        let word = self.rest[..end].to_ascii_uppercase();
        self.rest = &self.rest[end..];
        Some(word)
    }
}

/// `s` starts with `/*`; returns what follows the matching `*/` (Postgres nests them), or ""
/// for an unterminated comment.
pub(crate) fn skip_block_comment(s: &str) -> &str {
    let bytes = s.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return &s[i..];
                }
            }
            _ => i += 1,
        }
    }
    ""
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_control_is_found_behind_comments_and_case() {
        for sql in [
            "BEGIN",
            "begin;",
            "  /* a /* nested */ comment */ -- line\n start transaction read write",
            // A carriage return ends a line comment too, as Postgres's lexer has it.
            "--\rBEGIN",
            "-- a comment\r\nROLLBACK",
            "(commit)",
            "PREPARE TRANSACTION 'x'",
            "rollback to savepoint s",
        ] {
            assert_eq!(
                classify(sql, Route::Write),
                Some(Refusal::TransactionControl),
                "{sql}"
            );
        }
    }

    #[test]
    fn session_changes_and_copy_are_refused() {
        for sql in [
            "SET x = 1",
            "reset all",
            "PREPARE p AS SELECT 1",
            "create temp table t (i int)",
            "CREATE GLOBAL TEMPORARY TABLE t (i int)",
            "create or replace temp view v as select 1",
            "LOCK items",
        ] {
            assert_eq!(
                classify(sql, Route::Write),
                Some(Refusal::SessionState),
                "{sql}"
            );
        }
        assert_eq!(
            classify("copy t to stdout", Route::Write),
            Some(Refusal::Copy)
        );
        for sql in [
            "ALTER ROLE ferry_app SET role = 'authenticated'",
            "alter user current_user password 'x'",
            "ALTER DATABASE postgres SET synchronous_commit = off",
            "alter system set fsync = off",
            "CREATE ROLE r LOGIN",
            "drop user r",
        ] {
            assert_eq!(classify(sql, Route::Write), Some(Refusal::Roles), "{sql}");
        }
    }

    #[test]
    fn read_only_callers_cannot_run_procedural_code() {
        for sql in ["DO $$BEGIN COMMIT; END$$", "  call p()"] {
            assert!(check(sql, Route::Write).is_ok(), "{sql}");
            assert!(check_read_only(sql, Route::Write).is_err(), "{sql}");
        }
        assert!(check_read_only("SELECT 1", Route::Write).is_ok());
    }

    #[test]
    fn ordinary_statements_pass() {
        for sql in [
            "SELECT 1",
            "  (SELECT 1) UNION (SELECT 2)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "VALUES (1)",
            "TABLE items",
            "SHOW server_version",
            "/* begin */ SELECT 'BEGIN'",
        ] {
            assert_eq!(classify(sql, Route::Read), None, "{sql}");
            assert_eq!(classify(sql, Route::Write), None, "{sql}");
        }
        for sql in [
            "UPDATE items SET name = 'x'",
            "insert into items values (1)",
            "CREATE TABLE t (i int)",
            "CREATE INDEX ON items (name)",
            "CALL p()",
        ] {
            assert_eq!(classify(sql, Route::Write), None, "{sql}");
            assert_eq!(classify(sql, Route::Read), Some(Refusal::NotARead), "{sql}");
        }
    }

    #[test]
    fn unterminated_comments_and_empty_text_are_not_reads() {
        assert_eq!(classify("/* open", Route::Read), Some(Refusal::NotARead));
        assert_eq!(classify("", Route::Write), None);
        assert_eq!(classify("--", Route::Read), Some(Refusal::NotARead));
    }
}

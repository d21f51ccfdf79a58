//! What a statement calls and reads, as Postgres's own parse of it says: the ground both for
//! a named read that skips the session reset (`statements::plain`) and for a read cached
//! with no tables named (`read::inferred`).
//!
//! A read changes its session only through a function it calls (`set_config`,
//! `pg_advisory_lock`, `nextval`, a user's PL/pgSQL): statements that would change it themselves
//! (SET, LISTEN, PREPARE, ...) are refused up front (`statements/class.rs`). Postgres marks every
//! function immutable, stable or volatile; for its own functions the mark is true, and only a
//! volatile one changes anything or gives another answer with no write. A user's function is
//! marked by its author, and Postgres checks nothing (a STABLE PL/pgSQL function may call
//! `set_config`): so a user-defined function, whatever its mark, makes a statement neither
//! plain nor cacheable, unless the operator vouches for it. Nor does anything the role
//! requests run as owns: a request could redefine it before the next analysis.
//!
//! The statement becomes the body of a temporary SQL function (`BEGIN ATOMIC`, Postgres 14 and
//! later) in a transaction that is rolled back. Postgres stores that body parsed
//! (`pg_proc.prosqlbody`), as it stores each view's (`pg_rewrite.ev_action`): those trees name
//! every relation a statement reads (`:relid`, through CTEs, subqueries and joins) and every
//! function, operator, aggregate and window function it calls (`:funcid`, `:opfuncid`,
//! `:aggfnoid`, `:winfnoid`), by oid. Followed from there, to any depth: the views among the
//! relations (their rules), their row-level-security policies (`pg_policy`), the CHECK
//! constraints of the domains among the types in play (`pg_constraint.conbin`), and each
//! aggregate's own functions (`pg_aggregate`). A statement Postgres cannot take as such a body
//! is not analysed.
//!
//! Named reads' verdicts are remembered by SQL text (`Analyses`), asked in the background at
//! startup, after every reload and every 10 s (`statements::plain`): until a read's verdict is
//! in, it is reset as any other.

use crate::store::postgres::failure::describe;
use postgres::Client;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What Postgres said about one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Analysis {
    /// The functions it calls, directly or through a view, a policy, a domain or an aggregate,
    /// that are not built-in immutable ones.
    pub functions: Vec<Called>,
    /// The relations it reads, directly or through a view or a policy, as `schema.name`, each
    /// with its kind (`pg_class.relkind`: `r` table, `p` partitioned table, `v` view, `m`
    /// materialized view, `f` foreign table, ...).
    pub relations: Vec<(String, char)>,
    /// The relations and functions among those that the role requests run as owns: a request
    /// could redefine them (`CREATE OR REPLACE VIEW`, `CREATE POLICY`, `ALTER FUNCTION`), so
    /// nothing Postgres says of them holds for the next request.
    pub owned: Vec<String>,
}

/// A function a statement calls: `now()`, stable, built in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Called {
    pub name: String,
    /// `i` immutable, `s` stable, `v` volatile (`pg_proc.provolatile`).
    pub volatility: char,
    /// Not one of Postgres's own (its volatility is its author's claim).
    pub user: bool,
}

impl Called {
    /// `stable now()`, `user-defined app.fmt(text)`.
    pub(crate) fn describe(&self) -> String {
        let kind = match (self.user, self.volatility) {
            (true, _) => "the user-defined function",
            (false, 'v') => "volatile",
            _ => "stable",
        };
        format!("{kind} {}", self.name)
    }
}

impl Analysis {
    /// What keeps it from leaving its session as it found it: the volatile functions it
    /// calls, every user-defined one, and whatever the request role owns among what it reads.
    pub(crate) fn unvouched(&self) -> Vec<String> {
        self.functions
            .iter()
            .filter(|f| f.user || f.volatility == 'v')
            .map(Called::describe)
            .chain(
                self.owned
                    .iter()
                    .map(|o| format!("{o}, which requests' own role owns")),
            )
            .collect()
    }
}

/// A read's verdict, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Analysed(Analysis),
    /// Postgres could not take it as a function body (or could not be asked): not plain.
    Unknown(String),
}

impl Verdict {
    pub(crate) fn plain(&self) -> bool {
        matches!(self, Verdict::Analysed(a) if a.unvouched().is_empty())
    }

    /// One line for the log and `--check-config`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Verdict::Analysed(a) if a.unvouched().is_empty() => format!(
                "plain (every function it calls is one of Postgres's own, immutable or stable; \
                 reads {}): no reset after a successful run (as an end user: always)",
                if a.relations.is_empty() {
                    "no relation".to_string()
                } else {
                    let names: Vec<&str> = a.relations.iter().map(|(r, _)| r.as_str()).collect();
                    names.join(", ")
                }
            ),
            Verdict::Analysed(a) => format!(
                "reset after every run: it calls {}",
                a.unvouched().join(", ")
            ),
            Verdict::Unknown(why) => format!("reset after every run: not analysed ({why})"),
        }
    }
}

/// The verdicts so far, by SQL text, and the reads still to analyse.
#[derive(Default)]
pub(crate) struct Analyses {
    map: Mutex<State>,
}

#[derive(Default)]
struct State {
    verdicts: HashMap<String, Verdict>,
    /// The named reads to keep verdicts for: (name, SQL).
    named: Vec<(String, String)>,
    /// Those whose verdict is (again) still to be asked.
    pending: Vec<(String, String)>,
    /// When every one of them was last put up to be asked.
    asked_at: Option<Instant>,
}

impl Analyses {
    /// Whether `sql` is known to be plain (false until its verdict is in).
    pub(crate) fn plain(&self, sql: &str) -> bool {
        self.lock().verdicts.get(sql).is_some_and(Verdict::plain)
    }

    /// Forgets every verdict and asks again for `named` (startup, reload: a function may have
    /// changed since).
    pub(crate) fn expect(&self, named: Vec<(String, String)>) {
        let mut s = self.lock();
        s.verdicts.clear();
        s.pending = named.clone();
        s.named = named;
        s.asked_at = Some(Instant::now());
    }

    /// Puts every named read up to be asked again once `period` has passed since the last
    /// time, keeping the verdicts until the new ones replace them: a function or view
    /// redefined since (`CREATE OR REPLACE`, `ALTER FUNCTION ... VOLATILE`) is seen within
    /// about `period`, with no reload.
    pub(crate) fn again_every(&self, period: Duration) {
        let mut s = self.lock();
        if s.pending.is_empty() && s.asked_at.is_none_or(|t| t.elapsed() >= period) {
            s.pending = s.named.clone();
            s.asked_at = Some(Instant::now());
        }
    }

    /// The reads still waiting for a verdict, as (name, SQL).
    pub(crate) fn pending(&self) -> Vec<(String, String)> {
        self.lock().pending.clone()
    }

    /// Takes `sql`'s verdict: it is no longer pending. A verdict for a statement no longer
    /// named (a reload came during the analysis) is dropped. True when it is new or changed.
    pub(crate) fn record(&self, sql: String, verdict: Verdict) -> bool {
        let mut s = self.lock();
        s.pending.retain(|(_, p)| *p != sql);
        if !s.named.iter().any(|(_, n)| *n == sql) {
            return false;
        }
        s.verdicts.insert(sql, verdict.clone()) != Some(verdict)
    }

    /// The analysis could not finish: the verdicts still pending are dropped (those reads are
    /// reset until Postgres answers again), never kept past the period they were due for.
    pub(crate) fn failed(&self) {
        let mut s = self.lock();
        let State {
            verdicts, pending, ..
        } = &mut *s;
        for (_, sql) in pending.iter() {
            verdicts.remove(sql);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain data: a panic elsewhere breaks nothing here.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Asks Postgres what `sql` calls and reads, on `client` (a session of the role the read runs
/// as), in a transaction rolled back before this returns. `Err`: the session failed (ask
/// again later); `Ok(Unknown)`: Postgres refused the statement as a function body.
pub(crate) fn analyse(client: &mut Client, sql: &str) -> Result<Verdict, postgres::Error> {
    let described = match client.prepare(sql) {
        Ok(s) => s,
        Err(e) if e.as_db_error().is_some() => return Ok(Verdict::Unknown(describe(&e))),
        Err(e) => return Err(e),
    };
    let params: Vec<String> = described
        .params()
        .iter()
        .map(|t| format!("{}.{}", ident(t.schema()), ident(t.name())))
        .collect();
    let body = sql.trim_end().trim_end_matches(';');
    // One statement per message (extended protocol): the body cannot end the transaction.
    let create = format!(
        "CREATE FUNCTION pg_temp.ferry_plain_probe({}) RETURNS SETOF record LANGUAGE sql \
         BEGIN ATOMIC {body}; END",
        params.join(", ")
    );
    let mut tx = client.build_transaction().read_only(false).start()?;
    if let Err(e) = tx.execute(create.as_str(), &[]) {
        return match e.as_db_error() {
            Some(_) => Ok(Verdict::Unknown(describe(&e))),
            None => Err(e),
        };
    }
    let rows = tx.query(WHAT_IT_CALLS, &[])?;
    let mut analysis = Analysis {
        functions: Vec::new(),
        relations: Vec::new(),
        owned: Vec::new(),
    };
    for row in rows {
        let (what, name, kind): (&str, String, String) = (row.get(0), row.get(1), row.get(2));
        let first = kind.chars().next().unwrap_or('?');
        if kind.ends_with('o') {
            analysis.owned.push(name.clone());
        }
        match what {
            "function" => analysis.functions.push(Called {
                name,
                volatility: first,
                user: kind.contains('u'),
            }),
            _ => analysis.relations.push((name, first)),
        }
    }
    tx.rollback()?;
    Ok(Verdict::Analysed(analysis))
}

/// The relations named in the probe's parse tree, then in the rules and row-level-security
/// policies of the relations among them, to any depth; the domains among the types in play
/// and their CHECK constraints; every function named in all those trees, and each aggregate's
/// own functions. Out: each function that is not a built-in immutable one (its volatility,
/// `u` when user-defined: an oid past Postgres's own, 16384), and each relation with its kind;
/// `o` after either when the role asking (the one requests run as) owns it, or is a member of
/// its owner; never for a superuser, which could change anything anyway (the role audit warns
/// about such a request role), or every read would count as its own.
const WHAT_IT_CALLS: &str = "
WITH RECURSIVE probe AS (
  SELECT oid, proargtypes FROM pg_proc
   WHERE proname = 'ferry_plain_probe' AND pronamespace = pg_my_temp_schema()
), rels(oid) AS (
  SELECT m[1]::oid FROM probe p JOIN pg_proc f ON f.oid = p.oid,
         regexp_matches(f.prosqlbody::text, ':relid (\\d+)', 'g') m
  UNION
  SELECT m[1]::oid FROM rels CROSS JOIN LATERAL (
      SELECT r.ev_action::text FROM pg_rewrite r WHERE r.ev_class = rels.oid
      UNION ALL
      SELECT coalesce(pl.polqual::text, '') || coalesce(pl.polwithcheck::text, '')
        FROM pg_policy pl WHERE pl.polrelid = rels.oid
    ) x(t), regexp_matches(x.t, ':relid (\\d+)', 'g') m
), parsed AS (
  SELECT f.prosqlbody::text AS t FROM probe p JOIN pg_proc f ON f.oid = p.oid
  UNION ALL
  SELECT r.ev_action::text FROM pg_rewrite r JOIN rels ON r.ev_class = rels.oid
  UNION ALL
  SELECT coalesce(pl.polqual::text, '') || coalesce(pl.polwithcheck::text, '')
    FROM pg_policy pl JOIN rels ON pl.polrelid = rels.oid
), types AS (
  SELECT DISTINCT m[2]::oid AS oid
    FROM parsed, regexp_matches(t, ':(resulttype|consttype|paramtype) (\\d+)', 'g') m
  UNION
  SELECT unnest(proargtypes::oid[]) FROM probe
), trees AS (
  SELECT t FROM parsed
  UNION ALL
  SELECT c.conbin::text FROM pg_constraint c JOIN pg_type ty ON ty.oid = c.contypid
    JOIN types ON types.oid = ty.oid
   WHERE ty.typtype = 'd' AND c.conbin IS NOT NULL
), named AS (
  SELECT DISTINCT m[2]::oid AS fn
    FROM trees, regexp_matches(t, ':(funcid|opfuncid|aggfnoid|winfnoid) (\\d+)', 'g') m
), called AS (
  SELECT fn FROM named
  UNION
  SELECT s FROM named JOIN pg_aggregate a ON a.aggfnoid = named.fn,
    unnest(ARRAY[a.aggtransfn, a.aggfinalfn, a.aggcombinefn, a.aggserialfn, a.aggdeserialfn,
                 a.aggmtransfn, a.aggminvtransfn, a.aggmfinalfn]::oid[]) s
   WHERE s <> 0
)
SELECT 'function', p.oid::regprocedure::text,
       p.provolatile::text || CASE WHEN p.oid >= 16384 THEN 'u' ELSE '' END
       || CASE WHEN p.oid >= 16384 AND pg_has_role(p.proowner, 'USAGE')
                    AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
               THEN 'o' ELSE '' END
  FROM called JOIN pg_proc p ON p.oid = called.fn
 WHERE p.provolatile <> 'i' OR p.oid >= 16384
UNION ALL
SELECT 'relation', n.nspname || '.' || c.relname,
       c.relkind::text
       || CASE WHEN c.oid >= 16384 AND pg_has_role(c.relowner, 'USAGE')
                    AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
               THEN 'o' ELSE '' END
  FROM rels JOIN pg_class c ON c.oid = rels.oid JOIN pg_namespace n ON n.oid = c.relnamespace
ORDER BY 1, 2";

/// A name as an SQL identifier, quoted.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain_verdict() -> Verdict {
        Verdict::Analysed(Analysis {
            functions: Vec::new(),
            relations: vec![("public.items".into(), 'r')],
            owned: Vec::new(),
        })
    }

    #[test]
    fn a_failed_analysis_drops_the_verdicts_it_was_due_to_renew() {
        let a = Analyses::default();
        let sql = "SELECT 1";
        a.expect(vec![("queries.one".into(), sql.into())]);
        a.record(sql.into(), plain_verdict());
        assert!(a.plain(sql));
        // Due again, and the analysis fails: the read is reset until Postgres answers.
        a.again_every(Duration::ZERO);
        a.failed();
        assert!(!a.plain(sql));
    }

    #[test]
    fn a_verdict_for_a_statement_no_longer_named_is_dropped() {
        let a = Analyses::default();
        a.expect(vec![("queries.one".into(), "SELECT 1".into())]);
        // A reload named another statement while the first one's analysis ran.
        a.expect(vec![("queries.two".into(), "SELECT 2".into())]);
        a.record("SELECT 1".into(), plain_verdict());
        assert!(!a.plain("SELECT 1"));
    }
}

//! What a statement calls and reads, as Postgres's own parse of it says: the ground both for
//! a named read that skips the session reset (`statements::plain`) and for a read cached
//! with no tables named (`read::inferred`).
//!
//! A read changes its session only through a function it calls (`set_config`,
//! `pg_advisory_lock`, `nextval`, a user's PL/pgSQL): statements that would change it themselves
//! (SET, LISTEN, PREPARE, ...) are refused up front (`statements/class.rs`). Postgres marks every
//! function immutable, stable or volatile, and only a volatile one may change anything. A read
//! whose result depends on nothing but its tables calls only immutable ones.
//!
//! The statement becomes the body of a temporary SQL function (`BEGIN ATOMIC`, Postgres 14 and
//! later) in a transaction that is rolled back. Postgres stores that body parsed
//! (`pg_proc.prosqlbody`), as it stores each view's (`pg_rewrite.ev_action`): those trees name
//! every relation a statement reads (`:relid`, through CTEs, subqueries and joins) and every
//! function, operator, aggregate and window function it calls (`:funcid`, `:opfuncid`,
//! `:aggfnoid`, `:winfnoid`), by oid. The views among the relations are followed to any depth,
//! system views included. A statement Postgres cannot take as such a body is not analysed.
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
    /// The functions it calls that are not immutable, directly or through a view, each with
    /// its volatility (`s` stable, `v` volatile): `("now()", 's')`.
    pub functions: Vec<(String, char)>,
    /// The relations it reads, directly or through a view, as `schema.name`, each with its
    /// kind (`pg_class.relkind`: `r` table, `p` partitioned table, `v` view, `m` materialized
    /// view, `f` foreign table, ...).
    pub relations: Vec<(String, char)>,
}

impl Analysis {
    /// The volatile functions it calls: empty for a read that leaves its session as it found it.
    pub(crate) fn volatile(&self) -> Vec<&str> {
        self.functions
            .iter()
            .filter(|(_, v)| *v == 'v')
            .map(|(f, _)| f.as_str())
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
        matches!(self, Verdict::Analysed(a) if a.volatile().is_empty())
    }

    /// One line for the log and `--check-config`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Verdict::Analysed(a) if a.volatile().is_empty() => format!(
                "plain (every function it calls is immutable or stable; reads {}): no reset \
                 after a successful run",
                if a.relations.is_empty() {
                    "no relation".to_string()
                } else {
                    let names: Vec<&str> = a.relations.iter().map(|(r, _)| r.as_str()).collect();
                    names.join(", ")
                }
            ),
            Verdict::Analysed(a) => format!(
                "reset after every run: it calls volatile {}",
                a.volatile().join(", ")
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

    /// Takes `sql`'s verdict: it is no longer pending.
    pub(crate) fn record(&self, sql: String, verdict: Verdict) {
        let mut s = self.lock();
        s.pending.retain(|(_, p)| *p != sql);
        s.verdicts.insert(sql, verdict);
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
    };
    for row in rows {
        let (what, name, kind): (&str, String, String) = (row.get(0), row.get(1), row.get(2));
        let kind = kind.chars().next().unwrap_or('?');
        match what {
            "function" => analysis.functions.push((name, kind)),
            _ => analysis.relations.push((name, kind)),
        }
    }
    tx.rollback()?;
    Ok(Verdict::Analysed(analysis))
}

/// The relations named in the probe's parse tree, then in the rules of the views among them,
/// to any depth; then every function named in those trees that is not immutable, and every
/// relation, with its kind.
const WHAT_IT_CALLS: &str = "
WITH RECURSIVE probe AS (
  SELECT oid FROM pg_proc
   WHERE proname = 'ferry_plain_probe' AND pronamespace = pg_my_temp_schema()
), rels(oid) AS (
  SELECT m[1]::oid FROM pg_proc p, regexp_matches(p.prosqlbody::text, ':relid (\\d+)', 'g') m
   WHERE p.oid = (SELECT oid FROM probe)
  UNION
  SELECT m[1]::oid FROM rels JOIN pg_rewrite r ON r.ev_class = rels.oid,
         regexp_matches(r.ev_action::text, ':relid (\\d+)', 'g') m
), trees AS (
  SELECT prosqlbody::text AS t FROM pg_proc WHERE oid = (SELECT oid FROM probe)
  UNION ALL
  SELECT r.ev_action::text FROM pg_rewrite r JOIN rels ON r.ev_class = rels.oid
), called AS (
  SELECT DISTINCT m[2]::oid AS fn
    FROM trees, regexp_matches(t, ':(funcid|opfuncid|aggfnoid|winfnoid) (\\d+)', 'g') m
)
SELECT 'function', p.oid::regprocedure::text, p.provolatile::text
  FROM called JOIN pg_proc p ON p.oid = called.fn
 WHERE p.provolatile <> 'i'
UNION ALL
SELECT 'relation', n.nspname || '.' || c.relname, c.relkind::text
  FROM rels JOIN pg_class c ON c.oid = rels.oid JOIN pg_namespace n ON n.oid = c.relnamespace
ORDER BY 1, 2";

/// A name as an SQL identifier, quoted.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

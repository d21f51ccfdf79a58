//! Which named reads may skip the session reset, as Postgres itself says it.
//!
//! A read changes its session only through a function it calls (`set_config`,
//! `pg_advisory_lock`, `nextval`, a user's PL/pgSQL): statements that would change it themselves
//! (SET, LISTEN, PREPARE, ...) are refused up front (`statements/class.rs`). Postgres marks every function
//! immutable, stable or volatile, and only a volatile one may change anything. So a read whose
//! every function, operator and aggregate, and every one of each view it reads (to any depth),
//! is immutable or stable leaves its session as it found it: it is *plain*.
//!
//! What a statement calls is read from Postgres's own parse of it, never from its text: the
//! statement becomes the body of a temporary SQL function (`BEGIN ATOMIC`, Postgres 14 and
//! later) in a transaction that is rolled back. Postgres stores that body parsed
//! (`pg_proc.prosqlbody`), as it stores each view's (`pg_rewrite.ev_action`), and those trees
//! name every function by oid (`:funcid`, `:opfuncid`, `:aggfnoid`, `:winfnoid`); the views
//! come from `pg_depend`. A statement Postgres cannot take as such a body is not plain.
//!
//! Verdicts are remembered by SQL text (`Analyses`), asked in the background at startup and
//! after every reload (`statements::plain`): until a read's verdict is in, it is reset as any
//! other.

use crate::store::postgres::failure::describe;
use postgres::Client;
use std::collections::HashMap;
use std::sync::Mutex;

/// What Postgres said about one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Analysis {
    /// The volatile functions it calls (`set_config(text,text,boolean)`), directly or through
    /// a view; empty for a plain read.
    pub volatile: Vec<String>,
    /// The relations it reads, directly or through a view (`items`, `public.post_view`).
    pub relations: Vec<String>,
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
        matches!(self, Verdict::Analysed(a) if a.volatile.is_empty())
    }

    /// One line for the log and `--check-config`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Verdict::Analysed(a) if a.volatile.is_empty() => format!(
                "plain (every function it calls is immutable or stable; reads {}): no reset \
                 after a successful run",
                if a.relations.is_empty() {
                    "no relation".to_string()
                } else {
                    a.relations.join(", ")
                }
            ),
            Verdict::Analysed(a) => format!(
                "reset after every run: it calls volatile {}",
                a.volatile.join(", ")
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
    /// Named reads whose verdict is still to be asked (startup, reload): (name, SQL).
    pending: Vec<(String, String)>,
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
        s.pending = named;
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
        volatile: Vec::new(),
        relations: Vec::new(),
    };
    for row in rows {
        let (kind, name): (&str, String) = (row.get(0), row.get(1));
        match kind {
            "volatile" => analysis.volatile.push(name),
            _ => analysis.relations.push(name),
        }
    }
    tx.rollback()?;
    Ok(Verdict::Analysed(analysis))
}

/// The probe's body and the views it reads, to any depth (a view's rule depends on what the
/// view reads), then every function named in their parse trees: the volatile ones, and the
/// relations.
const WHAT_IT_CALLS: &str = "
WITH RECURSIVE probe AS (
  SELECT oid FROM pg_proc
   WHERE proname = 'ferry_plain_probe' AND pronamespace = pg_my_temp_schema()
), objs(classid, objid) AS (
  SELECT 'pg_proc'::regclass::oid, oid FROM probe
  UNION
  SELECT x.classid, x.objid FROM objs o CROSS JOIN LATERAL (
    SELECT d.refclassid, d.refobjid FROM pg_depend d
     WHERE d.classid = o.classid AND d.objid = o.objid AND d.deptype = 'n'
       AND (o.classid = 'pg_rewrite'::regclass OR o.objid = (SELECT oid FROM probe))
    UNION ALL
    SELECT 'pg_rewrite'::regclass, r.oid FROM pg_rewrite r
     WHERE o.classid = 'pg_class'::regclass AND r.ev_class = o.objid
  ) x(classid, objid)
), trees AS (
  SELECT prosqlbody::text AS t FROM pg_proc WHERE oid = (SELECT oid FROM probe)
  UNION ALL
  SELECT r.ev_action::text FROM pg_rewrite r
    JOIN objs o ON o.classid = 'pg_rewrite'::regclass AND o.objid = r.oid
), called AS (
  SELECT DISTINCT m[2]::oid AS fn
    FROM trees, regexp_matches(t, ':(funcid|opfuncid|aggfnoid|winfnoid) (\\d+)', 'g') m
)
SELECT 'volatile', p.oid::regprocedure::text FROM called JOIN pg_proc p ON p.oid = called.fn
 WHERE p.provolatile = 'v'
UNION ALL
SELECT 'relation', c.oid::regclass::text FROM objs
  JOIN pg_class c ON objs.classid = 'pg_class'::regclass AND c.oid = objs.objid
ORDER BY 1, 2";

/// A name as an SQL identifier, quoted.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

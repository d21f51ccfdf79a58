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
//! The verdicts are remembered in `verdicts`, and forgotten when the schema changes (`schema`).

use super::ask::Ask;
use crate::store::postgres::failure::describe;
use postgres::{Client, Row};

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
    /// A hash of everything Postgres parsed for it: the statement's own tree, its views'
    /// rules, their policies and domains' checks, each relation's kind, privileges, schema's
    /// privileges and row-level-security switches, every role's attributes and memberships and
    /// the roles' settings. Any redefinition that can change its result (`CREATE OR
    /// REPLACE VIEW`, `ALTER TABLE ... ADD COLUMN` under a `SELECT *`, `GRANT`, `ENABLE ROW
    /// LEVEL SECURITY`, a table dropped and made again) changes it: cached entries carry it in
    /// their fingerprint, so entries of the old definition are never found again.
    pub shape: String,
    /// The reads by a column's value, one or more per table, that cover every table it reads
    /// (`by_value`); empty when it is not such a read.
    pub by_value: Vec<super::by_value::ByValue>,
    /// A read of the first rows of its one table in an index's order (`top_n`).
    pub top_n: Option<super::top_n::TopN>,
}

/// A function a statement calls: `now()`, stable, built in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Called {
    pub name: String,
    /// `i` immutable, `s` stable, `v` volatile (`pg_proc.provolatile`).
    pub volatility: char,
    /// Not one of Postgres's own (its volatility is its author's claim).
    pub user: bool,
    /// `schema.name(argument types)` (`public.shout(text)`), as `cache.immutable_functions`
    /// names it; empty for what is not a function call (the current time, `TABLESAMPLE`).
    pub qualified: String,
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

/// Asks Postgres what `sql` calls and reads, on `client` (a session of the role the read runs
/// as), in a transaction rolled back before this returns; with `publication` (the change
/// stream's), also whether it reads its tables by values. `Err`: the session failed (ask
/// again later); `Ok(Unknown)`: Postgres refused the statement as a function body. On a
/// blocking session (`--check-config`, startup, the blocking pool).
pub(crate) fn analyse(
    client: &mut Client,
    sql: &str,
    publication: Option<&str>,
) -> Result<Verdict, postgres::Error> {
    super::ask::blocking(analyse_with(client, sql, publication)).unwrap_or_else(|| {
        Ok(Verdict::Unknown(
            "the session did not answer at once".into(),
        ))
    })
}

/// [`analyse`] on a worker's own session (its event loop), for a read on the request path:
/// the same conversation. The caller resets the session after it.
pub(crate) async fn analyse_on_loop(
    client: &tokio_postgres::Client,
    sql: &str,
    publication: &str,
) -> Result<Verdict, postgres::Error> {
    analyse_with(client, sql, Some(publication)).await
}

async fn analyse_with(
    mut client: impl Ask,
    sql: &str,
    publication: Option<&str>,
) -> Result<Verdict, postgres::Error> {
    let described = match client.prepare(sql).await {
        Ok(s) => s,
        Err(e) if settled(&e) => return Ok(Verdict::Unknown(describe(&e))),
        Err(e) => return Err(e),
    };
    let create = probe(sql, described.params());
    // Sessions start read-only (pinned at connect): the probe is made, read and rolled back.
    client.batch(BEGIN).await?;
    if let Err(e) = client.execute(&create).await {
        client.batch("ROLLBACK").await?;
        return match settled(&e) {
            true => Ok(Verdict::Unknown(describe(&e))),
            false => Err(e),
        };
    }
    let rows = client.query(WHAT_IT_CALLS, &[]).await;
    let mut verdict = rows.map(|rows| verdict_of(rows, sql));
    // A read of tables (through views or not) and nothing else: perhaps of the rows of one
    // value in each.
    if let (Ok(Verdict::Analysed(a)), Some(publication)) = (&mut verdict, publication) {
        if let Some(tables) = super::by_value::candidate(&a.relations, &a.functions) {
            let types: Vec<u32> = described.params().iter().map(|t| t.oid()).collect();
            a.by_value = super::by_value::by_value(&mut client, sql, &types, &tables, publication)
                .await
                .unwrap_or_default();
            // Else perhaps the first rows of its one table in an index's order; not through
            // a view (whose OFFSET is in its own parse tree, not the statement's).
            let view = a.relations.iter().any(|(_, k)| *k == 'v');
            if let ([table], true) = (tables.as_slice(), a.by_value.is_empty() && !view) {
                let fields: Vec<String> = described
                    .columns()
                    .iter()
                    .map(|c| c.name().to_string())
                    .collect();
                let asked = (types.as_slice(), fields.as_slice());
                a.top_n = super::top_n::top_n(&mut client, sql, asked, table, publication).await;
            }
        }
    }
    client.batch("ROLLBACK").await?;
    verdict
}

/// The probe's transaction, which writes (its temporary function, rolled back) and is named
/// apart in `pg_stat_activity` while it lasts: Ferry's own analysis, not a request's
/// transaction left open.
const BEGIN: &str = "BEGIN READ WRITE; SET LOCAL application_name = 'ferry-analysis'";

/// The probe: `sql` as the body of a temporary function taking its parameters. One statement
/// per message (extended protocol): the body cannot end the transaction.
fn probe(sql: &str, params: &[postgres::types::Type]) -> String {
    let params: Vec<String> = params
        .iter()
        .map(|t| format!("{}.{}", ident(t.schema()), ident(t.name())))
        .collect();
    let body = sql.trim_end().trim_end_matches(';');
    // The end on a line of its own: a statement that ends in a `--` comment keeps its end.
    format!(
        "CREATE FUNCTION pg_temp.ferry_plain_probe({}) RETURNS SETOF record LANGUAGE sql \
         BEGIN ATOMIC {body}\n; END",
        params.join(", ")
    )
}

/// Whether Postgres's refusal of the statement is its answer for as long as the schema stays
/// as it is (a syntax error, an unknown or forbidden name, a value that cannot be a literal, a
/// feature it lacks): such a verdict is remembered. Anything else (a timeout, a lock, a lost
/// session) is asked again next time.
fn settled(e: &postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|d| matches!(&d.code().code()[..2], "42" | "0A" | "22"))
}

/// Whether `sql` names a date or time Postgres reads as "at this moment" (`'now'`, `'today'`,
/// ...): parsed into a constant each time the statement is, so its result changes with no
/// write. Looked for only when Postgres's parse holds a date or time constant.
fn relative_time(sql: &str) -> bool {
    let sql = sql.to_ascii_lowercase();
    ["now", "today", "tomorrow", "yesterday"]
        .iter()
        .any(|w| sql.contains(w))
}

/// The verdict in [`WHAT_IT_CALLS`]'s rows for `sql`.
fn verdict_of(rows: Vec<Row>, sql: &str) -> Verdict {
    let mut analysis = Analysis {
        functions: Vec::new(),
        relations: Vec::new(),
        owned: Vec::new(),
        shape: String::new(),
        by_value: Vec::new(),
        top_n: None,
    };
    for row in rows {
        let (what, name, kind): (&str, String, String) = (row.get(0), row.get(1), row.get(2));
        let qualified: String = row.get(3);
        let first = kind.chars().next().unwrap_or('?');
        if kind.ends_with('o') {
            analysis.owned.push(name.clone());
        }
        match what {
            "function" => analysis.functions.push(Called {
                name,
                volatility: first,
                user: kind.contains('u'),
                qualified,
            }),
            "shape" => analysis.shape = name,
            "timeconst" if relative_time(sql) => analysis.functions.push(Called {
                name: "a date or time such as 'now' or 'today' (read when it is parsed)".into(),
                volatility: 's',
                user: false,
                qualified: String::new(),
            }),
            "timeconst" => {}
            _ => analysis.relations.push((name, first)),
        }
    }
    Verdict::Analysed(analysis)
}

/// The relations named in the probe's parse tree, then in the rules and row-level-security
/// policies of the relations among them, and their inheritance children and partitions (a
/// read of the parent returns theirs), to any depth; the domains among the types in play
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
      UNION ALL
      SELECT ':relid ' || i.inhrelid FROM pg_inherits i WHERE i.inhparent = rels.oid
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
               THEN 'o' ELSE '' END,
       pn.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
  FROM called JOIN pg_proc p ON p.oid = called.fn JOIN pg_namespace pn ON pn.oid = p.pronamespace
 WHERE p.provolatile <> 'i' OR p.oid >= 16384
UNION ALL
SELECT 'relation', n.nspname || '.' || c.relname,
       c.relkind::text
       || CASE WHEN c.oid >= 16384 AND pg_has_role(c.relowner, 'USAGE')
                    AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
               THEN 'o' ELSE '' END, ''
  FROM rels JOIN pg_class c ON c.oid = rels.oid JOIN pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT 'function', 'the current date or time (CURRENT_TIMESTAMP, CURRENT_DATE, LOCALTIME, ...)', 's', ''
 WHERE EXISTS (SELECT 1 FROM trees WHERE t ~ '\\{SQLVALUEFUNCTION :op [0-8] ')
UNION ALL
SELECT 'function', 'TABLESAMPLE (another sample each run)', 's', ''
 WHERE EXISTS (SELECT 1 FROM trees WHERE t ~ ':tsmhandler ')
UNION ALL
SELECT 'timeconst', '', '', ''
 WHERE EXISTS (SELECT 1 FROM trees WHERE t ~ ':consttype (1082|1083|1114|1184|1266) ')
UNION ALL
SELECT 'shape', md5(coalesce((SELECT string_agg(t, ' ' ORDER BY t) FROM trees), '')
         || coalesce((SELECT string_agg(c.oid || c.relkind::text || coalesce(c.relacl::text, '')
                                        || c.relrowsecurity || c.relforcerowsecurity,
                                        ' ' ORDER BY c.oid)
                        FROM rels JOIN pg_class c ON c.oid = rels.oid), '')
         || coalesce((SELECT string_agg(a.attrelid || a.attname || a.attacl::text, ','
                                        ORDER BY a.attrelid, a.attnum)
                        FROM rels JOIN pg_attribute a ON a.attrelid = rels.oid
                       WHERE a.attacl IS NOT NULL), '')
         || coalesce((SELECT string_agg(DISTINCT n.oid || coalesce(n.nspacl::text, ''), ' ')
                        FROM rels JOIN pg_class c ON c.oid = rels.oid
                        JOIN pg_namespace n ON n.oid = c.relnamespace), '')
         || (SELECT md5(string_agg(oid || rolname || rolsuper || rolinherit || rolbypassrls, ','
                                   ORDER BY oid)) FROM pg_roles)
         || coalesce((SELECT md5(string_agg(roleid || '.' || member, ',' ORDER BY roleid, member))
                        FROM pg_auth_members), '')
         || coalesce((SELECT md5(string_agg(setdatabase || '.' || setrole || ':'
                                            || array_to_string(setconfig, ','), ','
                                            ORDER BY setdatabase, setrole))
                        FROM pg_db_role_setting), '')), '', ''
ORDER BY 1, 2";

/// A name as an SQL identifier, quoted.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

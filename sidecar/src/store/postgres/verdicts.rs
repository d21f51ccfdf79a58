//! The verdicts Postgres gave (`analysis`), remembered: the named reads' (`Analyses`, by SQL
//! text, asked in the background at startup, after every reload and every 10 s:
//! `statements::plain`) and those of reads cached with no tables named (`Inferences`, by role
//! and SQL text, asked on the request path the first time a statement is seen: `read::inferred`).
//! Both are forgotten when the schema changes (`schema`).

use super::analysis::Verdict;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How many statements' inferred verdicts a sidecar keeps (each one a statement's text and
/// what it reads): past it, all are forgotten and asked again, so a caller sending ever new
/// statements costs analyses, never memory.
const MAX_INFERRED: usize = 4096;

/// How many statements may be analysed at once for inference. A read that finds its
/// statement's analysis under way, or this many under way, is answered from Postgres
/// (`bypass`) rather than waiting: a burst of new statements costs Postgres that many
/// analyses at a time, however many requests carry them.
const MAX_ASKING: usize = 2;

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

    /// Forgets every verdict and asks again for every named read (the schema changed): until
    /// Postgres answers, they are reset.
    pub(crate) fn forget_all(&self) {
        let named = self.lock().named.clone();
        self.expect(named);
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

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain data: a panic elsewhere breaks nothing here.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A statement's role (a Neon token's `postgres_url`; None: `postgres.url`'s) and the SHA-256
/// of its text: a long statement costs its analysis, never its length kept in memory.
type InferKey = (Option<Arc<str>>, [u8; 32]);

/// The verdicts of reads cached with no tables named, by role and SQL text.
#[derive(Default)]
pub(crate) struct Inferences {
    map: Mutex<Inferring>,
}

#[derive(Default)]
struct Inferring {
    verdicts: HashMap<InferKey, Arc<Verdict>>,
    asking: HashSet<InferKey>,
    /// Bumped when the schema changes: an analysis that began before it is not recorded.
    epoch: u64,
}

/// What is known of a statement.
pub(crate) enum Inferred<'a> {
    Known(Arc<Verdict>),
    /// Not known: the holder asks Postgres, and records the answer with the ticket.
    Ask(Ticket<'a>),
    /// Being asked (or too many analyses under way): not known yet.
    Busy,
}

/// The right to ask about one statement; dropped unrecorded (the request ended, Postgres
/// failed), it lets the next read ask.
pub(crate) struct Ticket<'a> {
    owner: &'a Inferences,
    key: InferKey,
    epoch: u64,
}

impl Inferences {
    pub(crate) fn get(&self, role: Option<&Arc<str>>, sql: &str) -> Inferred<'_> {
        let key = (role.cloned(), Sha256::digest(sql.as_bytes()).into());
        let mut s = self.lock();
        if let Some(v) = s.verdicts.get(&key) {
            return Inferred::Known(v.clone());
        }
        if s.asking.contains(&key) || s.asking.len() >= MAX_ASKING {
            return Inferred::Busy;
        }
        s.asking.insert(key.clone());
        Inferred::Ask(Ticket {
            owner: self,
            epoch: s.epoch,
            key,
        })
    }

    /// Forgets every verdict (the schema changed): each statement is asked again when next
    /// read, and analyses under way are not recorded (they still count against
    /// [`MAX_ASKING`] until they end).
    pub(crate) fn forget_all(&self) {
        let mut s = self.lock();
        s.verdicts.clear();
        s.epoch += 1;
    }

    fn lock(&self) -> MutexGuard<'_, Inferring> {
        // Plain data: a panic elsewhere breaks nothing here.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Ticket<'_> {
    /// Records the verdict, unless the schema changed while it was asked. The verdict either way.
    pub(crate) fn record(self, verdict: Verdict) -> Arc<Verdict> {
        let verdict = Arc::new(verdict);
        let mut s = self.owner.lock();
        if s.epoch == self.epoch {
            if s.verdicts.len() >= MAX_INFERRED {
                s.verdicts.clear();
            }
            s.verdicts.insert(self.key.clone(), verdict.clone());
        }
        verdict
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.owner.lock().asking.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::analysis::Analysis;

    fn plain_verdict() -> Verdict {
        Verdict::Analysed(Analysis {
            functions: Vec::new(),
            relations: vec![("public.items".into(), 'r')],
            owned: Vec::new(),
            shape: String::new(),
            by_value: Vec::new(),
            top_n: None,
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

    #[test]
    fn an_inference_asked_before_a_schema_change_is_not_recorded() {
        let i = Inferences::default();
        let Inferred::Ask(ticket) = i.get(None, "SELECT 1") else {
            panic!("a new statement is asked")
        };
        assert!(matches!(i.get(None, "SELECT 1"), Inferred::Busy));
        i.forget_all();
        // Still being asked: a schema change does not let more analyses run at once.
        assert!(matches!(i.get(None, "SELECT 1"), Inferred::Busy));
        ticket.record(plain_verdict());
        assert!(matches!(i.get(None, "SELECT 1"), Inferred::Ask(_)));
    }

    #[test]
    fn inferences_are_kept_per_role_and_a_dropped_ticket_lets_the_next_read_ask() {
        let i = Inferences::default();
        let role: Arc<str> = Arc::from("postgres://a@h/d");
        let Inferred::Ask(t) = i.get(None, "SELECT 1") else {
            panic!("asked")
        };
        t.record(plain_verdict());
        assert!(matches!(i.get(None, "SELECT 1"), Inferred::Known(_)));
        match i.get(Some(&role), "SELECT 1") {
            Inferred::Ask(t) => drop(t),
            _ => panic!("another role's verdict is its own"),
        }
        assert!(matches!(i.get(Some(&role), "SELECT 1"), Inferred::Ask(_)));
    }
}

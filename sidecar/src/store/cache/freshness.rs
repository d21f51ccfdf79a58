//! How far the change stream's invalidations have caught up with commits, and the gate that
//! makes reads bypass the cache while they lag.
//!
//! The consuming sidecar marks the stream every `changes.heartbeat_ms`: it notes the time T,
//! then writes a message into the WAL. Everything committed before T sits in the WAL ahead of
//! that message, so once the message comes out of the stream and every change ahead of it is
//! invalidated in Redis, the cache is fresh for every commit before T. T (the watermark) goes
//! to Redis, where every sidecar reads it. A sidecar serves cached reads only while the
//! watermark is younger than `changes.max_lag_ms` and newer than its own start: so a read that
//! starts more than `max_lag_ms` after a commit never sees the rows from before it, a consumer
//! that stopped (dead, Redis down, slot lost) turns every sidecar's reads into bypass within
//! `max_lag_ms`, and a sidecar that was down serves nothing cached until the stream has
//! replayed what it missed. Clocks: the sidecars' clocks must agree (NTP), as signing needs.
//!
//! The watermark also carries the mark's place in the WAL (its commit's end): every commit
//! before it has been invalidated. A read that carries a write's position (`after`) is served
//! from the cache only once the watermark has passed that position, so a cached read never
//! returns rows from before a write whose position it carries, even a write that named no
//! invalidation of its own (the read skips the cache until then).

use super::Cache;
use crate::store::pools::Pools;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the watermark lives in Redis, under the key prefix. Its two keys share the hash tag
/// `{changes}`: one script sets both, one MGET reads both, on a cluster too.
const WATERMARK_KEY: &str = "{changes}:fresh";
/// The watched tables' definitions the consumer last saw (a hash: table → digest).
const DEFINITIONS_KEY: &str = "changes:definitions";

/// The mark's place in the WAL, as 16 hex digits (compared as strings: Lua's numbers are
/// doubles).
const WATERMARK_POSITION_KEY: &str = "{changes}:fresh_at";
/// The last watermark set by a consumer that moves the keys of values and the tags of added
/// rows and changed columns (`deps.rs`, from 2026-12-05): while it is the watermark, every
/// commit before it moved them, and reads may be named by a value or depend on their rows
/// (top-N reads). A consumer of an earlier version (a rolling deploy) sets the watermark alone
/// (or `{changes}:fresh_values`, which moved values only), and such reads depend on their
/// tables again.
const WATERMARK_VALUES_KEY: &str = "{changes}:fresh_rows";

/// Sets the watermark only forward (a late write from a consumer that lost its lease cannot
/// move it back): its time in KEYS[1] (and in KEYS[3], see `WATERMARK_VALUES_KEY`), its WAL
/// position in KEYS[2].
const SET_MAX: &str = r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[3], ARGV[1])
end
local at = redis.call('GET', KEYS[2]) or ''
if ARGV[2] > at then redis.call('SET', KEYS[2], ARGV[2]) end
return 1";

#[derive(Debug, Default)]
pub(crate) struct Freshness {
    /// None: the change stream is off and the gate always opens.
    watch: Option<Watch>,
}

#[derive(Debug)]
struct Watch {
    started_ms: u64,
    max_lag_ms: u64,
    watermark_ms: AtomicU64,
    /// The watermark's place in the WAL (0: none seen yet).
    watermark_at: AtomicU64,
    /// The last watermark set by a consumer that moves the keys of values.
    values_ms: AtomicU64,
}

/// What /readyz and /metrics say about the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamState {
    Off,
    /// No watermark newer than this sidecar's start yet: replaying what it missed.
    CatchingUp,
    /// The watermark is older than `max_lag_ms`.
    Lagging,
    CaughtUp,
}

impl StreamState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StreamState::Off => "off",
            StreamState::CatchingUp => "catching_up",
            StreamState::Lagging => "lagging",
            StreamState::CaughtUp => "caught_up",
        }
    }
}

impl Freshness {
    pub(crate) fn watching(max_lag_ms: u64) -> Freshness {
        Freshness {
            watch: Some(Watch {
                started_ms: super::now_ms(),
                max_lag_ms,
                watermark_ms: AtomicU64::new(0),
                watermark_at: AtomicU64::new(0),
                values_ms: AtomicU64::new(0),
            }),
        }
    }

    /// The stream's state, and how old the watermark is in milliseconds.
    pub(crate) fn state(&self) -> (StreamState, Option<u64>) {
        let Some(w) = &self.watch else {
            return (StreamState::Off, None);
        };
        let mark = w.watermark_ms.load(Ordering::Acquire);
        if mark == 0 {
            return (StreamState::CatchingUp, None);
        }
        let age = super::now_ms().saturating_sub(mark);
        let state = if mark < w.started_ms {
            StreamState::CatchingUp
        } else if age > w.max_lag_ms {
            StreamState::Lagging
        } else {
            StreamState::CaughtUp
        };
        (state, Some(age))
    }

    /// Whether cached rows may be served: the stream is off, or caught up within the bound.
    pub(crate) fn serves(&self) -> bool {
        matches!(self.state().0, StreamState::Off | StreamState::CaughtUp)
    }

    /// Whether every commit up to `after` has been invalidated (always, with the stream off:
    /// then the writes' own invalidations keep the cache fresh).
    pub(crate) fn covers(&self, after: Option<ferry_shared::api::Position>) -> bool {
        match (&self.watch, after) {
            (Some(w), Some(p)) => w.watermark_at.load(Ordering::Acquire) >= p.0,
            _ => true,
        }
    }

    /// Whether reads may be named by a value (`cache::value_key`): the stream is on and its
    /// watermark was set by a consumer that moves the keys of values (see
    /// `WATERMARK_VALUES_KEY`).
    pub(crate) fn values_kept(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| {
            let mark = w.watermark_ms.load(Ordering::Acquire);
            mark != 0 && w.values_ms.load(Ordering::Acquire) >= mark
        })
    }

    fn advance(&self, mark_ms: u64, at: Option<u64>, values_ms: Option<u64>) {
        if let Some(w) = &self.watch {
            if let Some(v) = values_ms {
                w.values_ms.fetch_max(v, Ordering::AcqRel);
            }
            w.watermark_ms.fetch_max(mark_ms, Ordering::AcqRel);
            if let Some(at) = at {
                w.watermark_at.fetch_max(at, Ordering::AcqRel);
            }
        }
    }
}

impl Cache {
    /// Turns the freshness gate on (the change stream is enabled).
    pub(crate) fn watch_changes(mut self, max_lag_ms: u64) -> Cache {
        self.freshness = Freshness::watching(max_lag_ms);
        self
    }

    pub(crate) fn freshness(&self) -> &Freshness {
        &self.freshness
    }

    /// The consumer's mark: every commit before `mark_ms`, and before `at` in the WAL, is
    /// invalidated. Shared through Redis.
    pub(crate) fn publish_watermark(
        &self,
        pools: &Pools,
        mark_ms: u64,
        at: u64,
    ) -> Result<(), String> {
        let mut conn = pools.redis_conn().map_err(|e| e.to_string())?;
        redis::Script::new(SET_MAX)
            .key(format!("{}{WATERMARK_KEY}", self.prefix))
            .key(format!("{}{WATERMARK_POSITION_KEY}", self.prefix))
            .key(format!("{}{WATERMARK_VALUES_KEY}", self.prefix))
            .arg(mark_ms)
            .arg(format!("{at:016x}"))
            .invoke::<i64>(&mut *conn)
            .map_err(|e| e.to_string())?;
        self.freshness.advance(mark_ms, Some(at), Some(mark_ms));
        Ok(())
    }

    /// Reads the shared watermark (every sidecar, consumer or not, polls it).
    pub(crate) fn refresh_watermark(&self, pools: &Pools) -> Result<(), String> {
        let mut conn = pools.redis_conn().map_err(|e| e.to_string())?;
        let (mark, at, values): (Option<u64>, Option<String>, Option<u64>) = redis::cmd("MGET")
            .arg(format!("{}{WATERMARK_KEY}", self.prefix))
            .arg(format!("{}{WATERMARK_POSITION_KEY}", self.prefix))
            .arg(format!("{}{WATERMARK_VALUES_KEY}", self.prefix))
            .query(&mut *conn)
            .map_err(|e| e.to_string())?;
        if let Some(m) = mark {
            let at = at.and_then(|a| u64::from_str_radix(&a, 16).ok());
            self.freshness.advance(m, at, values);
        }
        Ok(())
    }
}

impl Cache {
    /// The watched tables' definitions as the last consumer saw them (a new consumer compares,
    /// so DDL while no sidecar consumed still drops what depends on the table).
    pub(crate) fn stored_definitions(
        &self,
        pools: &Pools,
    ) -> Result<std::collections::BTreeMap<String, String>, String> {
        let mut conn = pools.redis_conn().map_err(|e| e.to_string())?;
        redis::cmd("HGETALL")
            .arg(format!("{}{DEFINITIONS_KEY}", self.prefix))
            .query(&mut *conn)
            .map_err(|e| e.to_string())
    }

    pub(crate) fn store_definitions(
        &self,
        pools: &Pools,
        defs: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), String> {
        if defs.is_empty() {
            return Ok(());
        }
        let mut conn = pools.redis_conn().map_err(|e| e.to_string())?;
        let mut cmd = redis::cmd("HSET");
        cmd.arg(format!("{}{DEFINITIONS_KEY}", self.prefix));
        for (t, d) in defs {
            cmd.arg(t).arg(d);
        }
        cmd.query::<i64>(&mut *conn).map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_opens_only_for_a_recent_mark_newer_than_the_start() {
        assert!(Freshness::default().serves());
        let f = Freshness::watching(1_000);
        assert_eq!(f.state().0, StreamState::CatchingUp);
        f.advance(super::super::now_ms() - 60_000, None, None);
        assert_eq!(f.state().0, StreamState::CatchingUp, "older than the start");
        let start = f.watch.as_ref().map(|w| w.started_ms).unwrap_or(0);
        f.advance(start, None, None);
        assert!(f.serves());
        let lagging = Freshness::watching(1);
        let start = lagging.watch.as_ref().map(|w| w.started_ms).unwrap_or(0);
        lagging.advance(start, None, None);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(lagging.state().0, StreamState::Lagging);
        assert!(!lagging.serves());
    }

    #[test]
    fn a_position_is_covered_once_the_watermark_has_passed_it() {
        use ferry_shared::api::Position;
        assert!(
            Freshness::default().covers(Some(Position(u64::MAX))),
            "stream off"
        );
        let f = Freshness::watching(1_000);
        assert!(f.covers(None));
        assert!(!f.covers(Some(Position(1))), "no watermark yet");
        f.advance(1, Some(500), None);
        assert!(f.covers(Some(Position(500))));
        assert!(!f.covers(Some(Position(501))));
        f.advance(2, Some(100), None);
        assert!(f.covers(Some(Position(500))), "never moves back");
    }

    #[test]
    fn reads_are_named_by_a_value_only_under_a_consumer_that_moves_them() {
        assert!(!Freshness::default().values_kept(), "stream off");
        let f = Freshness::watching(1_000);
        assert!(!f.values_kept(), "no watermark yet");
        f.advance(10, None, Some(10));
        assert!(f.values_kept());
        // A consumer of an earlier version set a newer watermark alone.
        f.advance(20, None, Some(10));
        assert!(!f.values_kept());
        f.advance(30, None, Some(30));
        assert!(f.values_kept(), "a consumer that moves them leads again");
    }
}

//! A commit is invalidated once other sessions can see it. Postgres flushes a commit's record
//! to the WAL, then takes the transaction out of the running set; the stream reads the WAL, so
//! it can receive a commit that no new snapshot includes yet (a committing backend descheduled
//! between the two steps, or waiting for a synchronous standby). Invalidated in that window, a
//! read that misses reads the old row from Postgres and caches it under the new versions:
//! fresh by every check the cache makes, and served past any bound until the next write of that
//! row (the blog bench found it with the servers on one core; `change_stream_visibility.rs`
//! holds the window open). So before it invalidates, the consumer waits until Postgres's current
//! snapshot includes every transaction it is about to apply.

use super::session::Session;
use std::time::Duration;

/// Looks at the snapshot again at once this many times before pausing between looks: the
/// window is usually shorter than a round trip (in the staleness scenario, 32,270 of 32,630
/// rounds saw their commits at the first look, all but 7 of the rest within three).
const AT_ONCE: u32 = 20;
/// The longest pause between two looks at the snapshot, in milliseconds.
const MAX_PAUSE_MS: u64 = 50;

/// Waits until a new snapshot sees every one of `xids` (the 32-bit ids pgoutput's Begin
/// carries, of transactions the stream received as committed). Meanwhile nothing is applied or
/// confirmed and no mark is published, so cached reads bypass once the bound passes.
pub(super) async fn wait(session: &Session, xids: &[u32]) -> Result<(), String> {
    if xids.is_empty() {
        return Ok(());
    }
    let mut pause = Duration::from_millis(1);
    for look in 0.. {
        // One round trip: prepared once on the stream's session.
        let row = session
            .query_one("SELECT txid_current_snapshot()::text", &[])
            .await
            .map_err(|e| format!("the current snapshot: {e}"))?;
        let text: &str = row.get(0);
        let snapshot =
            Snapshot::parse(text).ok_or_else(|| format!("a snapshot Ferry cannot read: {text}"))?;
        if xids.iter().all(|x| snapshot.sees(*x)) {
            return Ok(());
        }
        if look >= AT_ONCE {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(MAX_PAUSE_MS));
        }
    }
    Ok(())
}

/// `txid_current_snapshot()`: `xmin:xmax:xip,...`, 64-bit ids (with their epoch).
#[derive(Debug, PartialEq)]
struct Snapshot {
    xmin: u64,
    xmax: u64,
    running: Vec<u64>,
}

impl Snapshot {
    fn parse(text: &str) -> Option<Snapshot> {
        let mut parts = text.splitn(3, ':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let running = match parts.next()? {
            "" => Vec::new(),
            list => list
                .split(',')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?,
        };
        Some(Snapshot {
            xmin,
            xmax,
            running,
        })
    }

    /// Whether the snapshot sees a committed transaction: it finished before the snapshot was
    /// taken (below `xmax`) and is not among those still running.
    fn sees(&self, xid: u32) -> bool {
        let full = widen(xid, self.xmax);
        full < self.xmin || (full < self.xmax && !self.running.contains(&full))
    }
}

/// The 64-bit id of a 32-bit one that is recent: the one within 2^31 of `next`.
fn widen(xid: u32, next: u64) -> u64 {
    let delta = xid.wrapping_sub(next as u32) as i32;
    next.wrapping_add_signed(i64::from(delta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_sees_what_finished_before_it_and_is_not_running() {
        let s = Snapshot::parse("100:105:101,103").expect("parses");
        assert_eq!(s.running, vec![101, 103]);
        assert!(s.sees(99) && s.sees(100) && s.sees(102) && s.sees(104));
        assert!(!s.sees(101) && !s.sees(103));
        // Committed in the WAL, not yet finished for snapshots.
        assert!(!s.sees(105) && !s.sees(200));
        let idle = Snapshot::parse("7:7:").expect("parses");
        assert!(idle.sees(6) && !idle.sees(7));
        assert_eq!(Snapshot::parse("7:x:"), None);
        assert_eq!(Snapshot::parse("7"), None);
    }

    #[test]
    fn ids_are_widened_across_the_epoch() {
        let epoch = 1u64 << 32;
        // xmax just past the wrap: a 32-bit id from just before it is of the last epoch.
        assert_eq!(widen(u32::MAX - 1, epoch + 5), epoch - 2);
        assert_eq!(widen(3, epoch + 5), epoch + 3);
        assert_eq!(widen(9, epoch + 5), epoch + 9);
        let s = Snapshot::parse(&format!("{}:{}:", epoch - 10, epoch + 5)).expect("parses");
        assert!(s.sees(u32::MAX - 1) && s.sees(4) && !s.sees(5));
    }
}

//! Replay protection at any rate: nonces seen, bucketed by their signed timestamp.
//!
//! The signature binds a nonce to its timestamp, so a replay carries the same timestamp and
//! only that second's bucket needs searching. Timestamps outside the clock window are refused
//! before this store is asked, so a bucket can be dropped whole once its second leaves the
//! window. Each request costs one hash of its nonce and one insert into one small locked set:
//! O(1) CPU and memory, no sweep, no cap, never a refusal for being full.
//!
//! Memory: about 50 bytes per request for `max_skew_s + 1` seconds (16-byte keys in hash sets
//! at their load factor; measured by the bench's `replay` scenario), i.e. ~1.6 KB per
//! request/s with the default 30 s window.

use crate::error::ApiError;
use crate::store::coordination::nonces::seen::{fingerprint, Seen};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

pub(crate) struct NonceStore {
    /// A ring of per-second buckets; two timestamps inside the window never share a slot.
    buckets: Vec<Mutex<Bucket>>,
    max_skew_s: u64,
    /// The last second whose expired bucket was dropped (done once a second).
    dropped_through: AtomicU64,
}

#[derive(Default)]
struct Bucket {
    second: u64,
    seen: HashSet<u128>,
}

impl NonceStore {
    pub(crate) fn new(max_skew_s: u64) -> Self {
        // Timestamps from now - skew to now + skew are accepted: 2 * skew + 1 seconds, plus one
        // slot for the second being dropped.
        let slots = 2 * max_skew_s as usize + 2;
        NonceStore {
            buckets: (0..slots).map(|_| Mutex::default()).collect(),
            max_skew_s,
            dropped_through: AtomicU64::new(0),
        }
    }

    fn slot(&self, second: u64) -> MutexGuard<'_, Bucket> {
        let i = (second % self.buckets.len() as u64) as usize;
        // A poisoned bucket still holds a valid set.
        self.buckets[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `nonce` (signed with `timestamp`, already checked to be within the window of
    /// `now_s`); refuses one already recorded. Returns it for the shared stores.
    pub(crate) fn check_and_insert(
        &self,
        nonce: &str,
        timestamp: u64,
        now_s: u64,
    ) -> Result<Seen, ApiError> {
        self.drop_expired(now_s);
        let key = fingerprint(nonce);
        let old = {
            let mut b = self.slot(timestamp);
            let old = if b.second != timestamp {
                // The slot still holds a second that left the window: start it afresh.
                b.second = timestamp;
                Some(std::mem::take(&mut b.seen))
            } else {
                None
            };
            if !b.seen.insert(key) {
                return Err(ApiError::Replayed);
            }
            old
        };
        // Freed outside the lock (one deallocation: the keys own no memory).
        drop(old);
        Ok(Seen {
            fingerprint: key,
            timestamp,
            until_s: timestamp + self.max_skew_s + 1,
        })
    }

    /// Once a second: empties the bucket of the second that just left the window, so memory
    /// holds `max_skew_s + 1` seconds of requests rather than a whole ring.
    fn drop_expired(&self, now_s: u64) {
        let Some(expired) = now_s.checked_sub(self.max_skew_s + 1) else {
            return;
        };
        if self.dropped_through.fetch_max(expired, Ordering::Relaxed) >= expired {
            return;
        }
        let old = {
            let mut b = self.slot(expired);
            (b.second <= expired).then(|| std::mem::take(&mut b.seen))
        };
        drop(old);
    }

    /// Nonces remembered right now (walks the ring: for tests, not the hot path).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| b.lock().map(|b| b.seen.len()).unwrap_or(0))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "00112233445566778899";

    #[test]
    fn replays_are_refused_within_the_window() {
        let store = NonceStore::new(30);
        store
            .check_and_insert(NONCE, 1000, 1000)
            .expect("first use");
        assert!(matches!(
            store.check_and_insert(NONCE, 1000, 1010),
            Err(ApiError::Replayed)
        ));
        assert!(matches!(
            store.check_and_insert(&NONCE.to_uppercase(), 1000, 1020),
            Err(ApiError::Replayed)
        ));
        // The same nonce under another timestamp is another signed request (the signature
        // binds the two); the timestamp check alone refuses it once outside the window.
        store
            .check_and_insert(NONCE, 1001, 1010)
            .expect("another second");
    }

    #[test]
    fn memory_holds_only_the_window() {
        let store = NonceStore::new(2);
        for s in 100..200u64 {
            for i in 0..10 {
                store
                    .check_and_insert(&format!("{s:08x}{i:08x}"), s, s)
                    .expect("fresh");
            }
            // At most skew + 1 seconds of requests are kept.
            assert!(store.len() <= 10 * 3, "{} at second {s}", store.len());
        }
    }

    #[test]
    fn a_bucket_left_behind_is_reused_not_merged() {
        let store = NonceStore::new(1);
        store.check_and_insert(NONCE, 10, 10).expect("first");
        // Four seconds later the ring has come round to slot 10 % 4 again.
        store
            .check_and_insert(NONCE, 14, 14)
            .expect("a new second, a new bucket");
        assert_eq!(store.len(), 1);
    }
}

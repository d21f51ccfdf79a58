//! Which entries this sidecar has lately seen in Redis: a guess, never a promise, that a
//! lookup will find its entry. A read guessed to miss takes its fill lease in its first lookup
//! (`read::shared_flight::lookup_one`), so that its miss does not spend a round trip on the
//! lease afterwards. A wrong guess costs little: a lease taken and at once released (the read
//! hit), or the round trip not saved (the read missed the way it always did). Nothing the
//! guess says decides what a read answers.
//!
//! Direct-mapped: one slot per hash, a newer entry overwriting an older one, no lock. Seeded
//! per process, so no caller can aim many keys at one slot of every sidecar.

use super::{Cache, Probe};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots: 32,768 of 8 bytes (256 KiB), about the hot entries of a busy sidecar.
const SLOTS: usize = 1 << 15;

pub(super) struct Known {
    slots: Box<[AtomicU64]>,
    seed: std::collections::hash_map::RandomState,
}

impl Default for Known {
    fn default() -> Known {
        Known {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            seed: Default::default(),
        }
    }
}

impl Known {
    /// The entry's hash (never 0, which marks an empty slot) and its slot.
    fn place(&self, key: &str, fingerprint: &str) -> (u64, &AtomicU64) {
        let h = self.seed.hash_one((key, fingerprint)) | 1;
        (h, &self.slots[(h >> 1) as usize % SLOTS])
    }

    /// The entry of `key` under `fingerprint` was in Redis (found, or written back).
    pub(super) fn saw(&self, key: &str, fingerprint: &str) {
        let (h, slot) = self.place(key, fingerprint);
        if slot.load(Ordering::Relaxed) != h {
            slot.store(h, Ordering::Relaxed);
        }
    }

    /// Whether it was lately.
    pub(super) fn likely(&self, key: &str, fingerprint: &str) -> bool {
        let (h, slot) = self.place(key, fingerprint);
        slot.load(Ordering::Relaxed) == h
    }
}

impl Cache {
    /// Whether the entry of `probe` is likely in Redis now, by what this sidecar has lately
    /// seen (`known.rs`): a guess, for a read deciding to take its fill lease early.
    pub(crate) fn likely_present(&self, probe: &Probe<'_>) -> bool {
        self.known.likely(probe.key, probe.fingerprint)
    }

    /// The entry of `key` under `fingerprint` was written back: guessed present from now on.
    pub(crate) fn written_back(&self, key: &str, fingerprint: &str) {
        self.known.saw(key, fingerprint);
    }
}

#[cfg(test)]
mod tests {
    use super::Known;

    #[test]
    fn remembers_what_it_saw_and_nothing_else() {
        let k = Known::default();
        assert!(!k.likely("users:1", "f"));
        k.saw("users:1", "f");
        assert!(k.likely("users:1", "f"));
        assert!(!k.likely("users:1", "g"), "another statement under the key");
        assert!(!k.likely("users:2", "f"));
    }
}

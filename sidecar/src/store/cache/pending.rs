//! Invalidations that could not reach Redis yet, bounded.
//!
//! Each key and tag remembers the generation of its latest deferral, so a flush removes only
//! what it applied: one deferred again while the flush ran stays. Past `max` entries the
//! individual keys are replaced by one "everything" mark: the flush then moves the cache-wide
//! epoch, which invalidates every entry at once. Nothing is ever dropped silently.

use std::collections::BTreeMap;

#[derive(Default)]
pub(super) struct Pending {
    keys: BTreeMap<String, u64>,
    tags: BTreeMap<String, u64>,
    /// Set when the bound was passed: the generation of the latest deferral since.
    everything: Option<u64>,
    generation: u64,
    max: usize,
}

/// One flush's share of the pending invalidations.
#[derive(Debug, Default)]
pub(super) struct Chunk {
    pub keys: Vec<(String, u64)>,
    pub tags: Vec<(String, u64)>,
    pub everything: Option<u64>,
}

impl Chunk {
    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.tags.is_empty() && self.everything.is_none()
    }
}

impl Pending {
    pub(super) fn new(max: usize) -> Self {
        Pending {
            max: max.max(1),
            ..Default::default()
        }
    }

    pub(super) fn add(&mut self, keys: &[String], tags: &[String]) {
        self.generation += 1;
        let g = self.generation;
        if self.everything.is_some() {
            self.everything = Some(g);
            return;
        }
        self.keys.extend(keys.iter().map(|k| (k.clone(), g)));
        self.tags.extend(tags.iter().map(|t| (t.clone(), g)));
        if self.keys.len() + self.tags.len() > self.max {
            tracing::warn!(
                max = self.max,
                "more invalidations wait for redis than limits.max_pending_invalidations: \
                 the whole cache will be invalidated when redis is back"
            );
            self.keys.clear();
            self.tags.clear();
            self.everything = Some(g);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.tags.is_empty() && self.everything.is_none()
    }

    /// Past the bound: the whole cache is to be invalidated.
    pub(super) fn is_everything(&self) -> bool {
        self.everything.is_some()
    }

    /// Keys and tags waiting (the whole cache counts as one).
    pub(super) fn len(&self) -> usize {
        self.keys.len() + self.tags.len() + usize::from(self.everything.is_some())
    }

    /// Up to `max` keys and tags to apply next (or the everything mark alone).
    pub(super) fn chunk(&self, max: usize) -> Chunk {
        if self.everything.is_some() {
            return Chunk {
                everything: self.everything,
                ..Default::default()
            };
        }
        let keys: Vec<(String, u64)> = self
            .keys
            .iter()
            .take(max)
            .map(|(k, g)| (k.clone(), *g))
            .collect();
        let room = max.saturating_sub(keys.len());
        let tags = self
            .tags
            .iter()
            .take(room)
            .map(|(t, g)| (t.clone(), *g))
            .collect();
        Chunk {
            keys,
            tags,
            everything: None,
        }
    }

    /// Forgets what `chunk` applied, unless it was deferred again since.
    pub(super) fn applied(&mut self, chunk: &Chunk) {
        if chunk.everything.is_some() && chunk.everything == self.everything {
            self.everything = None;
        }
        for (k, g) in &chunk.keys {
            if self.keys.get(k) == Some(g) {
                self.keys.remove(k);
            }
        }
        for (t, g) in &chunk.tags {
            if self.tags.get(t) == Some(g) {
                self.tags.remove(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_key_deferred_again_during_a_flush_stays() {
        let mut p = Pending::new(100);
        p.add(&s(&["a", "b"]), &s(&["t"]));
        let chunk = p.chunk(10);
        p.add(&s(&["a"]), &[]);
        p.applied(&chunk);
        assert_eq!(p.len(), 1, "a was deferred again while the flush ran");
        assert_eq!(p.chunk(10).keys[0].0, "a");
    }

    #[test]
    fn chunks_are_bounded() {
        let mut p = Pending::new(100);
        p.add(&s(&["a", "b", "c"]), &s(&["t", "u"]));
        let c = p.chunk(4);
        assert_eq!(c.keys.len() + c.tags.len(), 4);
        p.applied(&c);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn past_the_bound_everything_is_invalidated_not_dropped() {
        let mut p = Pending::new(3);
        p.add(&s(&["a", "b"]), &[]);
        p.add(&s(&["c", "d"]), &[]);
        assert_eq!(p.len(), 1);
        let c = p.chunk(10);
        assert!(c.everything.is_some() && c.keys.is_empty());
        p.add(&s(&["e"]), &[]);
        p.applied(&c);
        assert!(
            !p.is_empty(),
            "a deferral after the chunk needs another epoch move"
        );
        let c = p.chunk(10);
        p.applied(&c);
        assert!(p.is_empty());
    }
}

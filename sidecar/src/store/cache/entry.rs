//! A cached result as stored in Redis, and what it is worth when found.

use super::answer_rows::Rows;
use super::Observed;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// A cached result as stored in Redis. Its rows are written from values (`&[Row]`) and read
/// back as their JSON text, which a hit answers as it is (`Rows::Text`).
#[derive(Serialize, Deserialize)]
pub(super) struct Entry<R = Box<RawValue>> {
    /// Unix ms when the rows were read from Postgres.
    pub at_ms: u64,
    /// Fresh for this long after `at_ms`.
    pub ttl_ms: u64,
    /// Then served stale while revalidating for this long.
    #[serde(default)]
    pub swr_ms: u64,
    /// Kept for stale-if-error this long after the TTL.
    #[serde(default)]
    pub sie_ms: u64,
    /// The key's version token when the rows were read; the entry is valid only while the
    /// key's version is still this token. Empty in entries of older sidecars: never valid.
    #[serde(default)]
    pub ver: String,
    /// Tag (and the cache-wide epoch) -> version token when the rows were read.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    pub rows: R,
}

pub(crate) enum Lookup {
    /// Fresh in Redis.
    Hit {
        rows: Rows,
        age_ms: u64,
        observed: Observed,
    },
    /// Past its TTL, within stale-while-revalidate: serve it and refresh in the background.
    Revalidate {
        rows: Rows,
        age_ms: u64,
        observed: Observed,
    },
    /// Not usable as is; `stale` is an old copy allowed for stale-if-error.
    Miss {
        observed: Observed,
        stale: Option<(Rows, u64)>,
    },
    /// Redis unavailable, or invalidations pending: do not use the cache for this read.
    Bypass,
}

impl Lookup {
    /// What a found entry is worth to a reader whose own policy is `p`: never older than its
    /// TTL (past it, within its stale-while-revalidate: served and refreshed; past that, a
    /// miss, its stale-if-error copy only within its own grace), whatever TTL the reader that
    /// filled the entry asked for. Else a 30-day fill would answer a reader that asked for 10 s.
    pub(crate) fn within(self, p: &super::EntryPolicy) -> Lookup {
        let ttl = p.ttl_s.saturating_mul(1000);
        let swr = ttl.saturating_add(p.swr_s.saturating_mul(1000));
        let grace = ttl.saturating_add(p.stale_if_error_s.saturating_mul(1000));
        let miss = |rows: Rows, age_ms: u64, observed: Observed| Lookup::Miss {
            observed,
            stale: (age_ms <= grace).then_some((rows, age_ms)),
        };
        match self {
            Lookup::Hit {
                rows,
                age_ms,
                observed,
            }
            | Lookup::Revalidate {
                rows,
                age_ms,
                observed,
            } if age_ms > swr => miss(rows, age_ms, observed),
            Lookup::Hit {
                rows,
                age_ms,
                observed,
            } if age_ms > ttl => Lookup::Revalidate {
                rows,
                age_ms,
                observed,
            },
            Lookup::Miss {
                observed,
                stale: Some((rows, age_ms)),
            } => miss(rows, age_ms, observed),
            other => other,
        }
    }
}

/// Decides what a found entry is worth now. `observed` holds the current version of the key
/// and of every tag the read names (and the epoch); `current` the versions of every tag seen.
pub(super) fn classify(
    entry: Option<Entry>,
    observed: Observed,
    current: &BTreeMap<String, String>,
    now: u64,
) -> Lookup {
    let Some(e) = entry else {
        return Lookup::Miss {
            observed,
            stale: None,
        };
    };
    // Valid only under the key's current version, carrying every tag the read names, each
    // still at the version it was read under. Versions are random tokens that are never
    // reused, and a missing version (evicted, expired) matches no entry. Its rows are
    // answered as text: text that is not an array (never written by Ferry) is not an answer.
    let valid = e.rows.get().starts_with('[')
        && !e.ver.is_empty()
        && e.ver == observed.version
        && observed
            .tags
            .keys()
            .filter(|t| !t.starts_with(super::GUARD_TAG))
            .all(|t| e.tags.contains_key(t))
        && e.tags
            .iter()
            .all(|(t, v)| !v.is_empty() && current.get(t).is_some_and(|cur| cur == v));
    if !valid {
        return Lookup::Miss {
            observed,
            stale: None,
        };
    }
    let age_ms = now.saturating_sub(e.at_ms);
    let rows = Rows::Text(e.rows);
    if age_ms < e.ttl_ms {
        Lookup::Hit {
            rows,
            age_ms,
            observed,
        }
    } else if age_ms < e.ttl_ms + e.swr_ms {
        Lookup::Revalidate {
            rows,
            age_ms,
            observed,
        }
    } else {
        let stale = (age_ms < e.ttl_ms + e.sie_ms).then_some((rows, age_ms));
        Lookup::Miss { observed, stale }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(t, v)| (t.to_string(), v.to_string()))
            .collect()
    }

    fn entry(age_ms: u64, ver: &str, tags: &[(&str, &str)]) -> Entry {
        Entry {
            at_ms: 1_000_000 - age_ms,
            ttl_ms: 10_000,
            swr_ms: 5_000,
            sie_ms: 20_000,
            ver: ver.into(),
            tags: map(tags),
            rows: RawValue::from_string("[]".into()).unwrap(),
        }
    }

    fn seen(ver: &str, tags: &[(&str, &str)]) -> Observed {
        Observed {
            entry_key: String::new(),
            version: ver.into(),
            tags: map(tags),
        }
    }

    const NOW: u64 = 1_000_000;

    #[test]
    fn classification_by_age() {
        let cur = map(&[]);
        let o = || seen("v1", &[]);
        let at = |age| classify(Some(entry(age, "v1", &[])), o(), &cur, NOW);
        assert!(matches!(at(1), Lookup::Hit { .. }));
        assert!(matches!(at(12_000), Lookup::Revalidate { .. }));
        assert!(matches!(at(16_000), Lookup::Miss { stale: Some(_), .. }));
        assert!(matches!(at(31_000), Lookup::Miss { stale: None, .. }));
    }

    #[test]
    fn a_moved_or_missing_version_invalidates() {
        let cur = map(&[]);
        let e = || Some(entry(1, "v1", &[]));
        assert!(matches!(
            classify(e(), seen("v2", &[]), &cur, NOW),
            Lookup::Miss { stale: None, .. }
        ));
        // The version key was evicted or expired: no entry is trusted.
        assert!(matches!(
            classify(e(), seen("", &[]), &cur, NOW),
            Lookup::Miss { stale: None, .. }
        ));
        // An entry without a version (an older sidecar's) is never trusted.
        assert!(matches!(
            classify(Some(entry(1, "", &[])), seen("", &[]), &cur, NOW),
            Lookup::Miss { .. }
        ));
    }

    #[test]
    fn moved_or_missing_tags_invalidate() {
        let fresh = || Some(entry(1, "v", &[("items", "a")]));
        let o = |t: &str| seen("v", &[("items", t)]);
        assert!(matches!(
            classify(fresh(), o("a"), &map(&[("items", "a")]), NOW),
            Lookup::Hit { .. }
        ));
        assert!(matches!(
            classify(fresh(), o("b"), &map(&[("items", "b")]), NOW),
            Lookup::Miss { stale: None, .. }
        ));
        assert!(matches!(
            classify(fresh(), o(""), &map(&[("items", "")]), NOW),
            Lookup::Miss { stale: None, .. }
        ));
        // The read names a tag the entry was not stored under: not trusted.
        let more = seen("v", &[("items", "a"), ("users", "u")]);
        assert!(matches!(
            classify(fresh(), more, &map(&[("items", "a"), ("users", "u")]), NOW),
            Lookup::Miss { .. }
        ));
    }
}

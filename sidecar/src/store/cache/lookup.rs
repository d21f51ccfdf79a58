//! Lookups: many entries in one Redis round trip, versions read (or created) with them.

use super::{classify, now_ms, token, Cache, Entry, Lookup, Observed, Probe, EPOCH_TAG, KEY_TAG};
use crate::error::ApiError;
use crate::store::blocking::Blocking;
use crate::store::coordination::leases::Attempt;
use crate::store::coordination::nonces::NonceCheck;
use crate::store::pools::send::{redis_down, send, How};
use crate::store::pools::Pools;
use redis::{RedisResult, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What a lookup gave: the replay check's verdict and the fill lease's reply, when they rode
/// in front of it and Redis answered; each probe's entry.
pub(crate) type Looked = (Option<Result<(), ApiError>>, Option<Value>, Vec<Lookup>);

/// A lookup pipeline built, waiting for Redis' answer.
pub(super) struct Prepared<'a> {
    pipe: redis::Pipeline,
    probes: &'a [Probe<'a>],
    entry_keys: Vec<String>,
    fresh: Vec<String>,
    tag_names: Vec<&'a str>,
    fresh_tags: Vec<String>,
}

impl Cache {
    /// Looks up many entries in one Redis round trip (`send`: on this worker's multiplexed
    /// connection when it can). Answers in the order of `probes`. A replay check given rides
    /// in front of the lookup (one message to Redis); its verdict comes back when it was sent
    /// and the pipeline answered. So does a fill lease (`lease`, a read guessed to miss): it
    /// goes in front of both, and Redis runs the lookup after it (see
    /// [`Cache::lookup_behind`]); its reply comes back when it was sent. Redis unavailable:
    /// every read bypasses. Err only when the blocking pool refused the work.
    pub(crate) async fn lookup_many(
        &self,
        pools: &Arc<Pools>,
        blocking: &Blocking,
        probes: &[Probe<'_>],
        (check, lease): (Option<&NonceCheck>, Option<&Attempt>),
    ) -> Result<Looked, ApiError> {
        // The lease first: its reply is read before anything else of the answer can fail,
        // so a lease Redis took is never lost with a failed lookup (nor left to lapse).
        let front = |pipe: &mut redis::Pipeline| {
            if let Some(l) = lease {
                pipe.ignore_errors();
                l.add_to(pipe);
            }
            if let Some(c) = check {
                c.add_to(pipe);
            }
        };
        let Some(prepared) = self.prepare_lookup(pools, probes, front) else {
            return Ok((None, None, bypass(probes)));
        };
        // On a connection Redis ended, the lookup goes again (the replay check and the lease
        // riding in front too: each knows its own earlier attempt).
        let how = How {
            each: check.is_some() || lease.is_some(),
            again: true,
        };
        let sent = match send(pools, blocking, &prepared.pipe, how).await {
            Ok(sent) => sent,
            Err(e) if redis_down(&e) => return Ok((None, None, bypass(probes))),
            Err(e) => return Err(e),
        };
        let (reply, sent) = match (lease, sent) {
            (Some(_), Ok(mut v)) if !v.is_empty() => {
                let reply = v.remove(0);
                (Some(reply), Ok(v))
            }
            (_, sent) => (None, sent),
        };
        let (verdict, values) = NonceCheck::split(check, sent);
        let values = values.and_then(|v: Vec<Value>| {
            v.into_iter()
                .map(|v| redis::from_redis_value(v.extract_error()?).map_err(Into::into))
                .collect()
        });
        Ok((verdict, reply, self.read_lookup(pools, prepared, values)))
    }

    /// One lookup behind a fill lease's `SET NX`, in one message to a single Redis, which
    /// runs the lookup after the `SET`: it sees every fill whose lease was let go before ours
    /// was taken (a holder releases only after its write-back). The lease's reply comes first.
    /// None when they cannot go together (a cluster keeps the lease and the entry on different
    /// nodes, which order nothing between them; the cache not usable now; Redis failing): the
    /// caller then sends the lease, and looks up after its answer.
    pub(crate) async fn lookup_behind(
        &self,
        pools: &Arc<Pools>,
        blocking: &Blocking,
        probe: &Probe<'_>,
        lease: &Attempt,
    ) -> Option<(Option<Value>, Lookup)> {
        if pools.redis_cluster() || !pools.redis_breaker_closed() {
            return None;
        }
        let probes = std::slice::from_ref(probe);
        let prepared = self.prepare_lookup(pools, probes, |pipe| {
            pipe.ignore_errors();
            lease.add_to(pipe);
        })?;
        // A lease's SET NX may not run twice (the second would find the first's).
        let how = How {
            each: true,
            again: false,
        };
        let values = send(pools, blocking, &prepared.pipe, how).await.ok()?;
        let (reply, values) = match values {
            Ok(v) => {
                let mut v = v.into_iter();
                let reply = v.next();
                let rest: RedisResult<Vec<Option<Vec<u8>>>> = v
                    .map(|v| redis::from_redis_value(v.extract_error()?).map_err(Into::into))
                    .collect();
                (reply, rest)
            }
            Err(e) => (None, Err(e)),
        };
        let found = self.read_lookup(pools, prepared, values).pop()?;
        Some((reply, found))
    }

    /// The pipeline of a lookup (behind what `front` adds: a replay check, a fill lease), or
    /// None when the cache is not usable now. Each version is read with SET NX GET: an existing
    /// one is returned, a missing one is created with a fresh token (the reply is then nil and
    /// the token ours).
    fn prepare_lookup<'a>(
        &self,
        pools: &Pools,
        probes: &'a [Probe<'a>],
        front: impl FnOnce(&mut redis::Pipeline),
    ) -> Option<Prepared<'a>> {
        if probes.is_empty() || !self.usable(pools) {
            return None;
        }
        let mut pipe = redis::pipe();
        front(&mut pipe);
        let mut tag_names: BTreeSet<&str> = BTreeSet::from([EPOCH_TAG]);
        let entry_keys: Vec<String> = probes
            .iter()
            .map(|p| self.entry_key(p.key, p.fingerprint))
            .collect();
        let mut fresh: Vec<String> = Vec::new();
        for (p, entry_key) in probes.iter().zip(&entry_keys) {
            let t = token();
            pipe.get(entry_key)
                .cmd("SET")
                .arg(self.version_key(p.key))
                .arg(&t)
                .arg("NX")
                .arg("GET")
                .arg("EX")
                .arg(self.flight_ttl_s);
            fresh.push(t);
            tag_names.extend(p.tags.iter().map(String::as_str));
        }
        let tag_names: Vec<&str> = tag_names.into_iter().collect();
        let mut fresh_tags: Vec<String> = Vec::new();
        for tag in &tag_names {
            let t = token();
            let c = pipe
                .cmd("SET")
                .arg(self.tag_key(tag))
                .arg(&t)
                .arg("NX")
                .arg("GET");
            // A key's version made by a lookup lives as long as a read can be in flight.
            if tag.starts_with(KEY_TAG) {
                c.arg("EX").arg(self.flight_ttl_s);
            }
            fresh_tags.push(t);
        }
        Some(Prepared {
            pipe,
            probes,
            entry_keys,
            fresh,
            tag_names,
            fresh_tags,
        })
    }

    /// Redis' answer to a lookup pipeline, classified; a failure trips the breaker and every
    /// read bypasses the cache.
    fn read_lookup(
        &self,
        pools: &Pools,
        prepared: Prepared<'_>,
        values: redis::RedisResult<Vec<Option<Vec<u8>>>>,
    ) -> Vec<Lookup> {
        let Prepared {
            probes,
            entry_keys,
            fresh,
            tag_names,
            fresh_tags,
            ..
        } = prepared;
        let values = match values {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "redis lookup failed; serving from postgres");
                pools.redis_failed(&e);
                return bypass(probes);
            }
        };
        let current_or = |v: Option<Vec<u8>>, mine: String| match v {
            Some(b) => String::from_utf8(b).unwrap_or_default(),
            None => mine,
        };
        let mut values = values.into_iter();
        let mut found: Vec<(Option<Entry>, String)> = Vec::with_capacity(probes.len());
        for (p, mine) in probes.iter().zip(fresh) {
            let entry = values
                .next()
                .flatten()
                .and_then(|b| serde_json::from_slice::<Entry>(&b).ok());
            if entry.is_some() {
                self.known.saw(p.key, p.fingerprint);
            }
            found.push((entry, current_or(values.next().flatten(), mine)));
        }
        let current: BTreeMap<String, String> = tag_names
            .iter()
            .zip(fresh_tags)
            .map(|(t, mine)| (t.to_string(), current_or(values.next().flatten(), mine)))
            .collect();
        let now = now_ms();
        probes
            .iter()
            .zip(found)
            .zip(entry_keys)
            .map(|((p, (entry, version)), entry_key)| {
                let tags = p
                    .tags
                    .iter()
                    .map(String::as_str)
                    .chain([EPOCH_TAG])
                    .map(|t| (t.to_string(), current.get(t).cloned().unwrap_or_default()))
                    .collect();
                let observed = Observed {
                    entry_key,
                    version,
                    tags,
                };
                classify(entry, observed, &current, now)
            })
            .collect()
    }
}

fn bypass(probes: &[Probe<'_>]) -> Vec<Lookup> {
    probes.iter().map(|_| Lookup::Bypass).collect()
}

//! Everything a request handler needs, built once at startup.

use crate::auth::Verifier;
use crate::cache::Cache;
use crate::config::Config;
use crate::error::{self, ApiError};
use crate::flight::Flights;
use crate::pools::{Blocking, Pools};
use std::sync::{Arc, Weak};
use std::time::Duration;

pub struct AppState {
    pub config: Config,
    pub pools: Arc<Pools>,
    pub cache: Arc<Cache>,
    pub flights: Arc<Flights>,
    pub verifier: Verifier,
    pub blocking: Blocking,
}

impl AppState {
    /// Builds the pools (without waiting for Redis or Postgres) and starts the background
    /// retry of deferred invalidations, which stops when the state is dropped.
    pub fn new(config: Config) -> Result<Arc<AppState>, ApiError> {
        error::set_retry_after_s(config.server.retry_after_s);
        let pools = Arc::new(Pools::new(&config)?);
        let timeout = config.request_timeout();
        let cache = Arc::new(Cache::new(
            &config.cache.key_prefix,
            timeout.as_secs(),
            config.cache.max_entry_bytes,
        ));
        // During a rotation both the new and the previous secret are accepted.
        let secrets = [&config.auth.secret, &config.auth.previous_secret]
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|s| s.as_bytes().to_vec())
            .collect();
        let verifier = Verifier::new(
            secrets,
            config.auth.max_skew_s,
            config.auth.max_nonces,
            config.server.body_limit_bytes,
            timeout,
        );
        let blocking = Blocking::new(config.server.max_in_flight, timeout);
        spawn_invalidation_retry(
            Arc::downgrade(&cache),
            Arc::downgrade(&pools),
            Duration::from_millis(config.cache.invalidation_retry_ms.max(10)),
        );
        Ok(Arc::new(AppState {
            config,
            pools,
            cache,
            flights: Arc::new(Flights::default()),
            verifier,
            blocking,
        }))
    }
}

fn spawn_invalidation_retry(cache: Weak<Cache>, pools: Weak<Pools>, every: Duration) {
    let spawned = std::thread::Builder::new()
        .name("ferry-invalidation-retry".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let (Some(cache), Some(pools)) = (cache.upgrade(), pools.upgrade()) else {
                return;
            };
            if cache.pending_count() > 0 {
                cache.flush_pending(&pools);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the invalidation retry thread");
    }
}

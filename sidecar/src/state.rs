//! Everything a request handler needs, built once at startup.

use crate::config::Config;
use crate::error::ApiError;
use crate::http::auth::Verifier;
use crate::http::error;
use crate::read::flight::Flights;
use crate::store::blocking::Blocking;
use crate::store::cache::Cache;
use crate::store::pools::Pools;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// Everything a request needs, shared by the workers. Its fields are the crate's own: tests
/// and the binary see it through the methods below.
pub struct AppState {
    /// Swapped whole on a reload (SIGHUP); read it with [`AppState::config`].
    config: RwLock<Arc<Config>>,
    pub(crate) pools: Arc<Pools>,
    pub(crate) cache: Arc<Cache>,
    pub(crate) flights: Arc<Flights>,
    pub(crate) verifier: Verifier,
    /// The nonce stores every sidecar shares (`auth.replay`).
    pub(crate) nonces: crate::store::coordination::nonces::SharedNonces,
    pub(crate) blocking: Blocking,
    pub(crate) readiness: Arc<crate::store::readiness::Readiness>,
    /// Interactive transactions held open across requests (a reaper ends abandoned ones).
    pub(crate) transactions: Arc<crate::store::statements::interactive::OpenTransactions>,
    /// The change stream's status (its consumer runs on a thread of its own).
    pub(crate) changes: Arc<crate::changes::Status>,
    /// Redis's command table for the Upstash protocol, read on first use.
    upstash: std::sync::OnceLock<Arc<crate::upstash::Commands>>,
    /// The Upstash door's own connections to its Redis (`upstash::conns`).
    pub(crate) upstash_conns: crate::upstash::conns::Conns,
    /// The script users' ACLs, as checked (`upstash::acl`).
    pub(crate) upstash_acl: crate::upstash::acl::Checked,
    /// End users' signing keys (`identity.jwks_url`), for the Neon driver's `authToken`.
    pub(crate) end_users: crate::http::end_user::EndUsers,
    /// Every background task, stopped together at shutdown (`background`).
    pub(crate) background: crate::background::Background,
    /// Streaming replicas for plain reads (`[replicas]`), and the positions writes return.
    pub(crate) replicas: Arc<crate::store::replicas::Replicas>,
    /// The read engine's handles (the same pools, cache, flights and blocking rule).
    pub(crate) reads: crate::read::Reads,
}

impl AppState {
    /// Builds the pools (without waiting for Redis, nor for a Postgres that is down) and starts the background
    /// retry of deferred invalidations, which stops when the state is dropped.
    pub fn new(config: Config) -> Result<Arc<AppState>, ApiError> {
        error::set_retry_after_s(config.server.retry_after_s);
        crate::tls::install_crypto_provider();
        let pools = Arc::new(Pools::new(&config)?);
        // Sessions shared by a pooler in between stop the sidecar here, saying why; a Postgres
        // that cannot be asked yet is asked again by the readiness probe (nothing is served from
        // it until then).
        match pools.own_sessions.check() {
            Err(e) if e.is_final() => return Err(ApiError::internal(e.to_string())),
            _ => {}
        }
        let timeout = config.request_timeout();
        let mut cache = Cache::new(
            &config.cache.key_prefix,
            timeout.as_secs(),
            config.cache.max_entry_bytes,
            config.limits.max_pending_invalidations,
        );
        cache = cache.negative_ttl(config.cache.negative_ttl_s);
        if config.changes.enabled {
            cache = cache.watch_changes(config.changes.max_lag_ms);
        }
        if config.redis.cluster {
            cache = cache.on_cluster(
                config.redis.cluster_wait_replicas,
                config.redis.cluster_wait_ms,
            );
        }
        if let Some(table) = crate::config::table_name(&config.cache.deferred_table) {
            cache = cache.keep_deferred_in(table);
        }
        let cache = Arc::new(cache);
        let background = crate::background::Background::default();
        let changes = crate::changes::start(&config, &cache, &pools, &background);
        let verifier = Verifier::new(
            secrets(&config),
            config.auth.max_skew_s,
            config.server.body_limit_bytes,
            timeout,
        );
        let nonces = crate::store::coordination::nonces::SharedNonces::new(
            config.auth.replay == crate::config::ReplayScope::Shared,
            &config.cache.key_prefix,
            &crate::config::table_name(&config.auth.nonce_table)
                .unwrap_or_else(|| "ferry.nonces".into()),
            config.auth.max_skew_s,
            // With a role of its own, Ferry grants requests' role its record function (with one
            // role, nothing needs granting).
            (!config.postgres.owner_url.is_empty())
                .then(|| crate::store::postgres::login_role(&config.postgres.url))
                .flatten(),
        );
        nonces.spawn_sweeper(&background, Arc::downgrade(&pools));
        let blocking = Blocking::new(config.server.max_in_flight, timeout);
        spawn_invalidation_retry(
            &background,
            Arc::downgrade(&cache),
            Arc::downgrade(&pools),
            Duration::from_millis(config.cache.invalidation_retry_ms.max(10)),
        );
        let readiness = Arc::new(crate::store::readiness::Readiness::default());
        crate::store::readiness::spawn_probe(
            &background,
            Arc::downgrade(&readiness),
            Arc::downgrade(&pools),
            Duration::from_millis(config.server.readiness_interval_ms.max(10)),
        );
        let transactions = Arc::new(
            crate::store::statements::interactive::OpenTransactions::new(
                config.max_open_transactions(),
                config.transaction_idle_timeout(),
                Duration::from_millis(config.limits.transaction_max_lifetime_ms),
            ),
        );
        spawn_reaper(&background, Arc::downgrade(&transactions));
        // Named reads skip the reset once Postgres finds them plain: asked now, after every
        // reload, every 10 s and whenever the schema changed (checked every second), again
        // every 250 ms while Postgres cannot be asked (a round with nothing due costs a lock).
        pools
            .plain
            .expect(crate::store::statements::plain::named_reads(&config, false));
        let weak = Arc::downgrade(&pools);
        background.every(
            "ferry-plain-reads",
            "named queries are reset after every run",
            Duration::from_millis(250),
            move || {
                let Some(pools) = weak.upgrade() else {
                    return false;
                };
                if !crate::store::statements::plain::check_schema(&pools) {
                    return true;
                }
                pools.plain.again_every(Duration::from_secs(10));
                crate::store::statements::plain::analyse_pending(&pools);
                true
            },
        );
        let flights = Arc::new(Flights::default());
        let leases = crate::store::coordination::leases::Leases::new(
            &config.cache.key_prefix,
            pools.has_wakeup_connection(),
        );
        leases.spawn_listener(
            &background,
            crate::store::redis::node_clients(&config.redis).map_err(ApiError::internal)?,
        );
        let replicas = Arc::new(crate::store::replicas::Replicas::new(&config)?);
        replicas.spawn_monitor(&background, Arc::downgrade(&pools));
        let reads = crate::read::Reads {
            replicas: replicas.clone(),
            pools: pools.clone(),
            cache: cache.clone(),
            flights: flights.clone(),
            blocking: blocking.clone(),
            leases,
        };
        let upstash_conns = crate::upstash::conns::Conns::new(&config);
        Ok(Arc::new(AppState {
            config: RwLock::new(Arc::new(config)),
            pools,
            cache,
            flights,
            verifier,
            nonces,
            blocking,
            readiness,
            changes,
            replicas,
            transactions,
            upstash: std::sync::OnceLock::new(),
            upstash_conns,
            upstash_acl: Default::default(),
            end_users: Default::default(),
            background,
            reads,
        }))
    }
}

/// Rolls back abandoned interactive transactions, ten times a second, until the state goes.
fn spawn_reaper(
    background: &crate::background::Background,
    transactions: Weak<crate::store::statements::interactive::OpenTransactions>,
) {
    background.every(
        "ferry-transaction-reaper",
        "abandoned interactive transactions are not rolled back",
        Duration::from_millis(100),
        move || {
            let Some(t) = transactions.upgrade() else {
                return false;
            };
            t.reap();
            true
        },
    );
}

/// Deferred invalidations flushed every `every`, and the shared table of them about once a
/// second (one cheap query while it is empty), until the state goes.
fn spawn_invalidation_retry(
    background: &crate::background::Background,
    cache: Weak<Cache>,
    pools: Weak<Pools>,
    every: Duration,
) {
    let mut table_due = std::time::Instant::now();
    background.every(
        "ferry-invalidation-retry",
        "deferred invalidations wait for a restart",
        every,
        move || {
            let (Some(cache), Some(pools)) = (cache.upgrade(), pools.upgrade()) else {
                return false;
            };
            if cache.pending_count() > 0 {
                cache.flush_pending(&pools);
            }
            if table_due.elapsed() >= Duration::from_secs(1) && pools.redis_available() {
                table_due = std::time::Instant::now();
                cache.flush_deferred_table(&pools);
            }
            true
        },
    );
}

impl AppState {
    /// Redis's command table (`COMMAND`) for the Upstash door, read once from the door's Redis
    /// (on a cluster shared with the cache, on a pooled connection of the cache's).
    pub async fn upstash_commands(&self) -> Result<Arc<crate::upstash::Commands>, String> {
        if let Some(c) = self.upstash.get() {
            return Ok(c.clone());
        }
        let config = self.config();
        let unavailable = |_| "ERR redis is unavailable".to_string();
        let reply = if self.pools.redis_cluster() && !config.upstash.own_redis() {
            let pools = self.pools.clone();
            let value = self
                .blocking
                .run(move || {
                    let mut conn = pools.redis_conn()?;
                    redis::cmd("COMMAND")
                        .query::<redis::Value>(&mut *conn)
                        .map_err(|e| ApiError::CacheUnavailable {
                            internal: e.to_string(),
                        })
                })
                .await
                .map_err(unavailable)?;
            crate::upstash::from_redis(&value)
        } else {
            // The table is about 200 KB; 16 MB is room for any server's. Its memory limit is
            // asked with it: what bounds a token's writes (a COPY of a large value makes Redis
            // allocate what the request never carried) is the server's maxmemory.
            let command = [b"COMMAND".to_vec()];
            let memory = [b"INFO".to_vec(), b"memory".to_vec()];
            let mut replies = self
                .upstash_conns
                .exchange(
                    None,
                    &[&command, &memory],
                    16 << 20,
                    Duration::from_secs(5),
                    true,
                )
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "upstash: the command table was not read");
                    "ERR redis is unavailable".to_string()
                })?;
            if let Some(crate::upstash::wire::Reply::Bulk(info)) = replies.get(1) {
                let unbounded = String::from_utf8_lossy(info)
                    .lines()
                    .any(|l| l.trim() == "maxmemory:0");
                if unbounded {
                    tracing::warn!(
                        "upstash: the door's Redis has no maxmemory: a token's writes (a COPY or \
                         SUNIONSTORE of large values) can take all of its server's memory; set \
                         maxmemory (with maxmemory-policy noeviction, so writes past it fail)"
                    );
                }
            }
            replies.truncate(1);
            replies
                .pop()
                .ok_or_else(|| "ERR redis is unavailable".to_string())?
        };
        // Only a table is kept: an error answer (-BUSY while a script runs, -NOPERM) kept as
        // an empty one would refuse every command until a restart.
        if !matches!(&reply, crate::upstash::wire::Reply::Array(all) if !all.is_empty()) {
            tracing::warn!(reply = ?reply, "upstash: Redis did not answer COMMAND with its table");
            return Err("ERR redis is unavailable".to_string());
        }
        let commands = Arc::new(crate::upstash::Commands::from_reply(&reply));
        Ok(self.upstash.get_or_init(|| commands).clone())
    }

    /// Connections the Redis pool holds now (open, idle or in use).
    pub fn redis_pool_connections(&self) -> u32 {
        self.pools.redis.state().connections
    }

    /// Reads that joined another's fill instead of querying Postgres themselves, so far.
    pub fn flights_joined(&self) -> u64 {
        self.flights.joined()
    }

    /// Invalidations waiting for Redis (kept, retried; reads bypass the cache meanwhile).
    pub fn pending_invalidations(&self) -> usize {
        self.cache.pending_count()
    }

    /// Whether cached reads are served now, as far as the change stream's freshness gate says
    /// (`store/cache/freshness.rs`): false while it is catching up or lagging.
    pub fn cache_serves(&self) -> bool {
        self.cache.freshness().serves()
    }

    /// Readiness probes made so far (each checks out one Redis and one Postgres connection;
    /// `/readyz` answers from the latest).
    pub fn readiness_probes(&self) -> u64 {
        self.readiness.probes()
    }

    /// Asks every background task to stop, and waits up to `within` for them.
    pub fn shutdown_background(&self, within: Duration) {
        self.background.shutdown(within);
    }

    /// The configuration in force (a snapshot: a reload does not change it under a request).
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Applies a reloaded config (`config::reload`): what can change live takes effect now,
    /// credentials first; returns the keys that changed but wait for a restart.
    pub fn reload(&self, new: Config) -> Vec<String> {
        let old = self.config();
        let r = crate::config::reload(&old, new, |url| self.pools.has_neon_role(url));
        self.verifier.set_secrets(secrets(&r.config));
        error::set_retry_after_s(r.config.server.retry_after_s);
        // Script users' passwords may have changed: their connections are opened anew.
        self.upstash_conns.forget_all();
        self.upstash_acl.forget_all();
        // Named reads may have changed (or the functions they call): asked again.
        self.pools
            .plain
            .expect(crate::store::statements::plain::named_reads(
                &r.config, false,
            ));
        match self.config.write() {
            Ok(mut w) => *w = Arc::new(r.config),
            Err(p) => *p.into_inner() = Arc::new(r.config),
        }
        r.restart
    }
}

/// The secrets a request may be signed with: during a rotation, the new and the previous one.
fn secrets(config: &Config) -> Vec<Vec<u8>> {
    [&config.auth.secret, &config.auth.previous_secret]
        .into_iter()
        .filter(|s| !s.is_empty())
        .map(|s| s.as_bytes().to_vec())
        .collect()
}

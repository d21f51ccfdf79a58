//! The two bounded r2d2 pools, and the rule for running blocking work off the actix workers.
//!
//! Pools never open more than `pool_size` connections, whatever the load: a request that cannot
//! get one within the checkout timeout is answered 503. Redis failures also trip a short
//! circuit breaker, so that while Redis is down reads go straight to Postgres instead of each
//! paying a connect timeout.

use crate::config::Config;
use crate::error::ApiError;
use r2d2_postgres::PostgresConnectionManager;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_postgres_rustls::MakeRustlsConnect;

pub type RedisPool = r2d2::Pool<RedisManager>;
pub type PgPool = r2d2::Pool<PgManager>;
pub type PgConn = r2d2::PooledConnection<PgManager>;
pub type RedisConn = r2d2::PooledConnection<RedisManager>;

/// One pooled Postgres session. `poisoned` marks a session that must not be reused (its reset
/// failed, or a result was abandoned mid-stream): r2d2 then closes it instead of pooling it.
pub struct PgSession {
    pub client: postgres::Client,
    pub poisoned: bool,
}

/// r2d2 manager for Postgres sessions that can be discarded by marking them poisoned.
pub struct PgManager(PostgresConnectionManager<MakeRustlsConnect>);

impl std::fmt::Debug for PgManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The connection settings hold the password: never printed.
        f.write_str("PgManager")
    }
}

impl r2d2::ManageConnection for PgManager {
    type Connection = PgSession;
    type Error = postgres::Error;

    fn connect(&self) -> Result<PgSession, postgres::Error> {
        self.0.connect().map(|client| PgSession {
            client,
            poisoned: false,
        })
    }

    fn is_valid(&self, conn: &mut PgSession) -> Result<(), postgres::Error> {
        self.0.is_valid(&mut conn.client)
    }

    fn has_broken(&self, conn: &mut PgSession) -> bool {
        conn.poisoned || conn.client.is_closed()
    }
}

/// r2d2 manager for Redis with connect and I/O timeouts (the redis crate's own manager has
/// none, so a silent network cut would hang a pool thread forever).
#[derive(Debug)]
pub struct RedisManager {
    client: redis::Client,
    connect_timeout: Duration,
    io_timeout: Duration,
}

impl r2d2::ManageConnection for RedisManager {
    type Connection = redis::Connection;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<redis::Connection, redis::RedisError> {
        let conn = self
            .client
            .get_connection_with_timeout(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.io_timeout))?;
        conn.set_write_timeout(Some(self.io_timeout))?;
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut redis::Connection) -> Result<(), redis::RedisError> {
        redis::cmd("PING").query::<String>(conn).map(|_| ())
    }

    fn has_broken(&self, conn: &mut redis::Connection) -> bool {
        !redis::ConnectionLike::is_open(conn)
    }
}

/// Logs connection failures r2d2 meets while filling a pool (it would otherwise drop them).
#[derive(Debug)]
struct LogErrors(&'static str);

impl<E: std::fmt::Display> r2d2::HandleError<E> for LogErrors {
    fn handle_error(&self, error: E) {
        tracing::warn!(pool = self.0, %error, "cannot open connection");
    }
}

pub struct Pools {
    pub redis: RedisPool,
    /// Always Some until drop (see `Drop for Pools`).
    pg: Option<PgPool>,
    redis_size: u32,
    pg_size: u32,
    /// Milliseconds since `epoch` until which Redis is considered down.
    redis_down_until_ms: AtomicU64,
    redis_retry_after_failure: Duration,
    epoch: Instant,
}

/// The Redis client: rediss:// URLs speak TLS, trusting `tls_ca_path` (PEM) when set.
pub fn redis_client(c: &crate::config::RedisConfig) -> Result<redis::Client, String> {
    if c.tls_ca_path.is_empty() {
        return redis::Client::open(c.url.as_str())
            .map_err(|_| "not a valid redis:// or rediss:// URL".to_string());
    }
    let ca = std::fs::read(&c.tls_ca_path)
        .map_err(|e| format!("redis.tls_ca_path {}: {e}", c.tls_ca_path))?;
    redis::Client::build_with_tls(
        c.url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )
    .map_err(|_| "not a valid rediss:// URL, or redis.tls_ca_path is not a PEM CA".to_string())
}

/// libpq's sslmode=verify-ca / verify-full mean "require, and verify": rustls always verifies
/// the certificate and the host name, so both are `require` for the Rust driver.
pub fn pg_url(url: &str) -> String {
    url.replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require")
}

/// TLS for Postgres: rustls trusting `postgres.tls_ca_path` (PEM) or the system's roots.
/// Whether TLS is used is the URL's `sslmode` (disable / prefer / require); without one, a
/// loopback server is reached in the clear and any other with `prefer`.
pub fn pg_tls(c: &crate::config::PostgresConfig) -> Result<MakeRustlsConnect, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    if c.tls_ca_path.is_empty() {
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
    } else {
        let certs = CertificateDer::pem_file_iter(&c.tls_ca_path)
            .and_then(|i| i.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("postgres.tls_ca_path {}: {e}", c.tls_ca_path))?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("postgres.tls_ca_path {}: {e}", c.tls_ca_path))?;
        }
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(tls))
}

/// Whether a host name is this machine: `localhost`, or an address in 127.0.0.0/8 or ::1,
/// decided on the parsed address (so `127.db.example.com` is not loopback).
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Problems with the database role the sidecar connects as: a superuser can read files and
/// run programs through SQL, and a role that bypasses row-level security ignores policies.
/// Connects once (blocking); Err when Postgres cannot be reached.
pub fn role_warnings(config: &Config) -> Result<Vec<String>, String> {
    let pg = pg_config(config).map_err(|e| e.to_string())?;
    let tls = pg_tls(&config.postgres)?;
    let mut client = pg
        .connect(tls)
        .map_err(|e| format!("cannot connect: {e}"))?;
    let row = client
        .query_one(
            "SELECT current_user::text, rolsuper, rolbypassrls FROM pg_roles \
             WHERE rolname = current_user",
            &[],
        )
        .map_err(|e| format!("cannot read the role: {e}"))?;
    let (who, superuser, bypassrls): (String, bool, bool) = (row.get(0), row.get(1), row.get(2));
    let mut out = Vec::new();
    if superuser {
        out.push(format!(
            "postgres.url connects as {who:?}, a superuser: SQL sent through Ferry could read \
             server files (pg_read_file) and run programs (COPY ... TO PROGRAM). Use a \
             least-privilege role (scripts/demo.sql creates ferry_app)."
        ));
    } else if bypassrls {
        out.push(format!(
            "postgres.url connects as {who:?}, which bypasses row-level security (BYPASSRLS): \
             policies will not apply to Ferry's queries."
        ));
    }
    Ok(out)
}

/// The Postgres connection settings, from the URL plus the sidecar's own settings.
pub fn pg_config(config: &Config) -> Result<postgres::Config, ApiError> {
    let c = &config.postgres;
    let url = pg_url(&c.url);
    let mut pg: postgres::Config = url
        .parse()
        .map_err(|_| ApiError::internal("postgres.url is not a valid URL"))?;
    if !url.contains("sslmode=") {
        // Without an sslmode: loopback in the clear, anything else over verified TLS (never
        // libpq's `prefer`, which a man in the middle can downgrade to plain text).
        let loopback = pg.get_hosts().iter().all(|h| match h {
            postgres::config::Host::Tcp(name) => is_loopback_host(name),
            postgres::config::Host::Unix(_) => true,
        });
        pg.ssl_mode(if loopback {
            postgres::config::SslMode::Disable
        } else {
            postgres::config::SslMode::Require
        });
    }
    pg.connect_timeout(Duration::from_millis(c.connect_timeout_ms));
    // Lets operators (and the pool-bound test) tell Ferry's backends apart in pg_stat_activity.
    pg.application_name("ferry-sidecar");
    // Session defaults, restored by the reset after every request (RESET ALL goes back to
    // the values given at connection start). Transactions are read-only unless a write asks
    // otherwise, so a read cannot write; a session left in a transaction is ended by Postgres.
    // client_min_messages: the reset's ROLLBACK warns when no transaction is open, and the
    // driver would log every such notice; callers never see notices anyway.
    let mut options = format!(
        "-c default_transaction_read_only=on -c client_min_messages=error \
         -c idle_in_transaction_session_timeout={}",
        config.server.request_timeout_ms.max(1000)
    );
    if c.statement_timeout_ms > 0 {
        options.push_str(&format!(" -c statement_timeout={}", c.statement_timeout_ms));
    }
    pg.options(&options);
    if let Some(password) = &c.password {
        pg.password(password);
    }
    Ok(pg)
}

impl Pools {
    /// Builds both pools without waiting for Redis or Postgres to answer: the sidecar starts
    /// (and reports not ready) while they are down, and connects when they come up.
    pub fn new(config: &Config) -> Result<Pools, ApiError> {
        let r = &config.redis;
        let client = redis_client(r).map_err(ApiError::internal)?;
        let redis = r2d2::Pool::builder()
            .max_size(r.pool_size)
            .min_idle(Some(r.min_idle))
            .connection_timeout(Duration::from_millis(r.checkout_timeout_ms))
            // A PING per checkout would double every cache round trip; broken connections are
            // caught by has_broken when they fail instead.
            .test_on_check_out(false)
            .error_handler(Box::new(LogErrors("redis")))
            .build_unchecked(RedisManager {
                client,
                connect_timeout: Duration::from_millis(r.connect_timeout_ms),
                io_timeout: Duration::from_millis(r.io_timeout_ms),
            });
        let p = &config.postgres;
        let pg = r2d2::Pool::builder()
            .max_size(p.pool_size)
            .min_idle(Some(p.min_idle))
            .connection_timeout(Duration::from_millis(p.checkout_timeout_ms))
            .test_on_check_out(false)
            .error_handler(Box::new(LogErrors("postgres")))
            .build_unchecked(PgManager(PostgresConnectionManager::new(
                pg_config(config)?,
                pg_tls(p).map_err(ApiError::internal)?,
            )));
        Ok(Pools {
            redis,
            pg: Some(pg),
            redis_size: r.pool_size,
            pg_size: p.pool_size,
            redis_down_until_ms: AtomicU64::new(0),
            redis_retry_after_failure: Duration::from_millis(r.retry_after_failure_ms),
            epoch: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// False while the circuit breaker is open after a Redis failure.
    pub fn redis_available(&self) -> bool {
        self.now_ms() >= self.redis_down_until_ms.load(Ordering::Relaxed)
    }

    /// Opens the circuit breaker: reads skip Redis for `retry_after_failure_ms`.
    pub fn mark_redis_failed(&self) {
        let until = self.now_ms() + self.redis_retry_after_failure.as_millis() as u64;
        self.redis_down_until_ms.store(until, Ordering::Relaxed);
    }

    /// A Redis connection, or why not. Trips the breaker on failure.
    pub fn redis_conn(&self) -> Result<RedisConn, ApiError> {
        let m = crate::metrics::global();
        m.redis_waiting.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let got = self.redis.get();
        m.redis_waiting.fetch_sub(1, Ordering::Relaxed);
        m.checkout("redis", start.elapsed());
        got.map_err(|e| {
            self.mark_redis_failed();
            ApiError::CacheUnavailable {
                internal: e.to_string(),
            }
        })
    }

    /// A Postgres connection. A timeout with every connection in use is overload (503
    /// `overloaded`); a timeout with free slots means connecting failed (503
    /// `database_unavailable`).
    pub fn pg_conn(&self) -> Result<PgConn, ApiError> {
        let pool = self
            .pg
            .as_ref()
            .ok_or_else(|| ApiError::internal("postgres pool used after shutdown"))?;
        let m = crate::metrics::global();
        m.pg_waiting.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let got = pool.get();
        m.pg_waiting.fetch_sub(1, Ordering::Relaxed);
        m.checkout("postgres", start.elapsed());
        got.map_err(|e| {
            if pool.state().connections >= self.pg_size {
                ApiError::Overloaded {
                    what: "postgres pool",
                }
            } else {
                ApiError::DatabaseUnavailable {
                    internal: e.to_string(),
                }
            }
        })
    }

    /// (open, idle) connections of the Postgres pool.
    pub fn pg_state(&self) -> (u32, u32) {
        self.pg
            .as_ref()
            .map(|p| {
                let s = p.state();
                (s.connections, s.idle_connections)
            })
            .unwrap_or((0, 0))
    }

    pub fn sizes(&self) -> (u32, u32) {
        (self.redis_size, self.pg_size)
    }
}

/// The blocking Postgres client closes its connection by blocking on a runtime of its own,
/// which panics inside another runtime, and the last reference to the pools is often dropped
/// on an actix thread at shutdown. So the Postgres pool is dropped on a plain thread.
impl Drop for Pools {
    fn drop(&mut self) {
        if let Some(pg) = self.pg.take() {
            let closer = std::thread::Builder::new()
                .name("ferry-pg-close".into())
                .spawn(move || drop(pg));
            if let Ok(handle) = closer {
                let _ = handle.join();
            }
        }
    }
}

/// Runs blocking work (pool checkouts, Redis, Postgres) on the blocking thread pool, never on
/// an actix worker. Bounded twice: at most `max_in_flight` jobs at once (beyond: 503 at once,
/// not a queue), and each job's answer is awaited at most `timeout` (beyond: 504; the job
/// itself is bounded by the pools' and Postgres' own timeouts, and keeps its in-flight slot
/// until it ends, so the bound holds).
#[derive(Clone)]
pub struct Blocking {
    slots: Arc<Semaphore>,
    timeout: Duration,
}

impl Blocking {
    pub fn new(max_in_flight: usize, timeout: Duration) -> Self {
        Blocking {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            timeout,
        }
    }

    pub async fn run<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded {
                what: "in-flight limit",
            })?;
        let job = actix_web::web::block(move || {
            let _slot = slot;
            f()
        });
        match tokio::time::timeout(self.timeout, job).await {
            Err(_) => Err(ApiError::Timeout {
                what: "the request",
            }),
            Ok(Err(e)) => Err(ApiError::internal(format!("blocking task failed: {e}"))),
            Ok(Ok(result)) => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres::config::SslMode;

    #[test]
    fn loopback_is_decided_on_the_address() {
        for host in ["localhost", "127.0.0.1", "127.3.2.1", "::1", "[::1]"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "127.db.example.com",
            "127.0.0.1.nip.io",
            "db",
            "10.0.0.1",
            "::2",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn remote_postgres_without_sslmode_gets_verified_tls() {
        let mode = |url: &str| {
            let mut c = Config::default();
            c.postgres.url = url.into();
            pg_config(&c).expect("valid").get_ssl_mode()
        };
        assert_eq!(mode("postgres://u@127.0.0.1:5432/db"), SslMode::Disable);
        assert_eq!(mode("postgres://u@db.example.com/db"), SslMode::Require);
        assert_eq!(mode("postgres://u@127.db.example.com/db"), SslMode::Require);
        assert_eq!(
            mode("postgres://u@db.example.com/db?sslmode=disable"),
            SslMode::Disable
        );
        assert_eq!(
            mode("postgres://u@db.example.com/db?sslmode=verify-full"),
            SslMode::Require
        );
    }
}

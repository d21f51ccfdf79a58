//! Redis connections: the client (rediss:// with a private CA), and an r2d2 manager with
//! connect and I/O timeouts whose connections die as a whole: each remembers the failure
//! generation it was opened in, and one Redis failure retires every connection opened
//! before it (a restarted Redis has dropped them all), instead of each being found dead by
//! a request of its own.

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionLike, RedisResult, Value};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// r2d2 manager for Redis with connect and I/O timeouts (the redis crate's own manager has
/// none, so a silent network cut would hang a pool thread forever).
#[derive(Debug)]
pub struct RedisManager {
    pub client: redis::Client,
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
    /// Bumped by every Redis failure (see `Pools::mark_redis_failed`).
    pub generation: Arc<AtomicU64>,
}

/// A pooled Redis connection and the failure generation it was opened in.
pub struct RedisSession {
    conn: redis::Connection,
    generation: u64,
}

impl RedisSession {
    /// Opened before the latest Redis failure: presumed dead with the others.
    pub fn is_stale(&self, current: u64) -> bool {
        self.generation < current
    }
}

impl ConnectionLike for RedisSession {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.conn.req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.conn.req_command(cmd)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.conn.check_connection()
    }

    fn is_open(&self) -> bool {
        self.conn.is_open()
    }
}

impl r2d2::ManageConnection for RedisManager {
    type Connection = RedisSession;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<RedisSession, redis::RedisError> {
        // Read before connecting: a failure during the connect makes this one stale too.
        let generation = self.generation.load(Ordering::Acquire);
        let conn = self
            .client
            .get_connection_with_timeout(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.io_timeout))?;
        conn.set_write_timeout(Some(self.io_timeout))?;
        Ok(RedisSession { conn, generation })
    }

    fn is_valid(&self, conn: &mut RedisSession) -> Result<(), redis::RedisError> {
        redis::cmd("PING").query::<String>(conn).map(|_| ())
    }

    fn has_broken(&self, conn: &mut RedisSession) -> bool {
        !conn.is_open() || conn.is_stale(self.generation.load(Ordering::Acquire))
    }
}

/// The Redis client: rediss:// URLs speak TLS, trusting `tls_ca_path` (PEM) when set.
pub fn redis_client(c: &crate::config::RedisConfig) -> Result<redis::Client, String> {
    let info = redis::IntoConnectionInfo::into_connection_info(c.url.as_str())
        .map_err(|_| "not a valid redis:// or rediss:// URL".to_string())?;
    client_for(c, info)
}

/// The same server, as another Redis user (the Upstash tokens' script users).
pub fn redis_client_as(
    c: &crate::config::RedisConfig,
    user: &str,
    password: &str,
) -> Result<redis::Client, String> {
    let info = redis::IntoConnectionInfo::into_connection_info(c.url.as_str())
        .map_err(|_| "not a valid redis:// or rediss:// URL".to_string())?;
    let settings = info
        .redis_settings()
        .clone()
        .set_username(user)
        .set_password(password);
    client_for(c, info.set_redis_settings(settings))
}

fn client_for(
    c: &crate::config::RedisConfig,
    info: redis::ConnectionInfo,
) -> Result<redis::Client, String> {
    if c.tls_ca_path.is_empty() {
        return redis::Client::open(info)
            .map_err(|_| "not a valid redis:// or rediss:// URL".to_string());
    }
    let ca = std::fs::read(&c.tls_ca_path)
        .map_err(|e| format!("redis.tls_ca_path {}: {e}", c.tls_ca_path))?;
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )
    .map_err(|_| "not a valid rediss:// URL, or redis.tls_ca_path is not a PEM CA".to_string())
}

/// One multiplexed async connection per actix worker, for commands that can run on the event
/// loop: no thread hop, no pool checkout, and the commands of concurrent requests share the
/// connection, pipelined. At most `max` are open (they count against `redis.pool_size`; the
/// r2d2 pool gets the rest); a worker without one uses the pool.
pub struct AsyncRedis {
    /// Tells this sidecar's connections apart from another's on the same thread (tests).
    id: u64,
    client: redis::Client,
    config: AsyncConnectionConfig,
    open: Arc<AtomicUsize>,
    max: usize,
}

/// A worker's connection, the failure generation it was opened in, and its slot.
struct Held {
    id: u64,
    generation: u64,
    conn: MultiplexedConnection,
    _slot: Slot,
}

/// One of `AsyncRedis::max`, given back when the connection is dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    /// One connection attempt at a time per worker: the requests that arrive while it runs
    /// wait for it, rather than each taking a slot (a burst on a fresh worker once took every
    /// slot there and left the other worker none, for good).
    static CONNECTING: RefCell<Vec<(u64, std::rc::Rc<tokio::sync::Mutex<()>>)>> =
        const { RefCell::new(Vec::new()) };
}

impl AsyncRedis {
    pub fn new(
        client: redis::Client,
        connect_timeout: Duration,
        io_timeout: Duration,
        max: usize,
    ) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(0);
        AsyncRedis {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            client,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(io_timeout)),
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// This worker's connection, opened on first use; None when every slot is taken. One
    /// opened before failure `generation` is replaced.
    pub async fn conn(&self, generation: u64) -> RedisResult<Option<MultiplexedConnection>> {
        let held = || {
            HELD.with(|h| {
                let mut h = h.borrow_mut();
                h.retain(|c| c.id != self.id || c.generation >= generation);
                h.iter().find(|c| c.id == self.id).map(|c| c.conn.clone())
            })
        };
        if let Some(conn) = held() {
            return Ok(Some(conn));
        }
        let gate = CONNECTING.with(|g| {
            let mut g = g.borrow_mut();
            match g.iter().find(|(id, _)| *id == self.id) {
                Some((_, gate)) => gate.clone(),
                None => {
                    let gate = std::rc::Rc::new(tokio::sync::Mutex::new(()));
                    g.push((self.id, gate.clone()));
                    gate
                }
            }
        });
        let _connecting = gate.lock().await;
        // Another request on this worker may have connected while this one waited.
        if let Some(conn) = held() {
            return Ok(Some(conn));
        }
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        if taken.is_err() {
            return Ok(None);
        }
        let slot = Slot(self.open.clone());
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        HELD.with(|h| {
            h.borrow_mut().push(Held {
                id: self.id,
                generation,
                conn: conn.clone(),
                _slot: slot,
            })
        });
        Ok(Some(conn))
    }

    /// Forgets this worker's connection (after a failure on it).
    pub fn drop_conn(&self) {
        HELD.with(|h| h.borrow_mut().retain(|c| c.id != self.id));
    }
}

//! Redis connections: the client (rediss:// with a private CA), and an r2d2 manager with
//! connect and I/O timeouts.

use std::time::Duration;

/// r2d2 manager for Redis with connect and I/O timeouts (the redis crate's own manager has
/// none, so a silent network cut would hang a pool thread forever).
#[derive(Debug)]
pub struct RedisManager {
    pub client: redis::Client,
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
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

//! The r2d2 pool's Redis connections, with connect and I/O timeouts, dying as a whole: each
//! remembers the failure generation it was opened in, and one Redis failure retires every
//! connection opened before it (a restarted Redis has dropped them all), instead of each being
//! found dead by a request of its own.

use super::RedisClient;
use redis::cluster::{ClusterConnection, ClusterPipeline};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ConnectionLike, FromRedisValue, RedisResult, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// r2d2 manager for Redis with connect and I/O timeouts (the redis crate's own manager has
/// none, so a silent network cut would hang a pool thread forever).
#[derive(Debug)]
pub(crate) struct RedisManager {
    pub client: RedisClient,
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
    /// Bumped by every Redis failure (see `Pools::mark_redis_failed`).
    pub generation: Arc<AtomicU64>,
}

enum Conn {
    Single(redis::Connection),
    /// A connection to each master, routed by slot.
    Cluster(Box<ClusterConnection>),
}

/// A pooled Redis connection and the failure generation it was opened in.
pub(crate) struct RedisSession {
    conn: Conn,
    generation: u64,
}

impl RedisSession {
    /// Opened before the latest Redis failure: presumed dead with the others.
    pub(crate) fn is_stale(&self, current: u64) -> bool {
        self.generation < current
    }

    /// Runs a pipeline. On a cluster: a transaction runs on its first key's node (its keys
    /// must share a slot: Ferry's keys do, by hash tags); any other pipeline is split by node,
    /// one pipeline per node, answers in the order sent; a lone command is routed by the
    /// cluster client itself (an MGET or DEL over many slots is split and joined). Do not
    /// `ignore()` commands: on a cluster their answers are kept.
    pub(crate) fn query_pipe<T: FromRedisValue>(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> RedisResult<T> {
        match &mut self.conn {
            Conn::Single(c) => pipe.query(c),
            // The cluster connection refuses `Pipeline::query`, but sends a transaction whole to
            // its first key's node; EXEC's answer holds every command's.
            Conn::Cluster(c) if pipe.is_transaction() => {
                let n = pipe.cmd_iter().count();
                let exec = c.req_packed_commands(&pipe.get_packed_pipeline(), n + 1, 1)?;
                redis::from_redis_value(exec.into_iter().next().unwrap_or(Value::Nil))
                    .map_err(Into::into)
            }
            Conn::Cluster(c) => {
                let cmds: Vec<&Cmd> = pipe.cmd_iter().collect();
                if let [one] = cmds[..] {
                    let v: Value = one.query(c)?;
                    return redis::from_redis_value(Value::Array(vec![v])).map_err(Into::into);
                }
                let mut split = ClusterPipeline::with_capacity(cmds.len());
                for cmd in cmds {
                    split.add_command(cmd.clone());
                }
                split.query(c)
            }
        }
    }
}

impl RedisSession {
    /// WAIT for `replicas` to hold this connection's writes, at most `timeout_ms`: the fewest
    /// replicas any master reached. On a cluster, asked of the master of each slot `keys` live
    /// in (and only those: a master elsewhere without a replica does not hold them up).
    pub(crate) fn wait_for_replicas(
        &mut self,
        keys: &[String],
        replicas: u32,
        timeout_ms: u64,
    ) -> RedisResult<i64> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout_ms);
        let c = match &mut self.conn {
            Conn::Single(c) => return wait.query(c),
            Conn::Cluster(c) => c,
        };
        let mut routes = HashSet::new();
        for k in keys {
            routes.insert(Route::new(slot(k.as_bytes()), SlotAddr::Master));
        }
        let mut fewest = i64::from(replicas);
        for r in routes {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(r));
            let reached: i64 = redis::from_redis_value(c.route_command(&wait, route)?)?;
            fewest = fewest.min(reached);
        }
        Ok(fewest)
    }
}

impl ConnectionLike for RedisSession {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match &mut self.conn {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match &mut self.conn {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match &mut self.conn {
            Conn::Single(c) => c.req_command(cmd),
            Conn::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.conn {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match &mut self.conn {
            Conn::Single(c) => c.check_connection(),
            Conn::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match &self.conn {
            Conn::Single(c) => c.is_open(),
            Conn::Cluster(c) => c.is_open(),
        }
    }
}

impl r2d2::ManageConnection for RedisManager {
    type Connection = RedisSession;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<RedisSession, redis::RedisError> {
        // Read before connecting: a failure during the connect makes this one stale too.
        let generation = self.generation.load(Ordering::Acquire);
        let conn = match &self.client {
            RedisClient::Single(client) => {
                let conn = client.get_connection_with_timeout(self.connect_timeout)?;
                conn.set_read_timeout(Some(self.io_timeout))?;
                conn.set_write_timeout(Some(self.io_timeout))?;
                Conn::Single(conn)
            }
            // Timeouts are the cluster client's own (`store_client`).
            RedisClient::Cluster(client) => Conn::Cluster(Box::new(client.get_connection()?)),
        };
        Ok(RedisSession { conn, generation })
    }

    fn is_valid(&self, conn: &mut RedisSession) -> Result<(), redis::RedisError> {
        redis::cmd("PING").query::<Value>(conn).map(|_| ())
    }

    fn has_broken(&self, conn: &mut RedisSession) -> bool {
        !conn.is_open() || conn.is_stale(self.generation.load(Ordering::Acquire))
    }
}

/// A key's hash slot, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of its hash
/// tag (what lies between the first `{` and the next `}`, when not empty), mod 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_match_redis_cluster() {
        // From the Redis Cluster specification, and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31C3, "CRC16 XMODEM check value");
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(
            slot(b"foo{}{bar}"),
            slot(b"bar"),
            "an empty tag hashes the whole key"
        );
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }
}

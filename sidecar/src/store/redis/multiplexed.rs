//! One multiplexed async connection per actix worker (to one server, or a cluster client's
//! connections to every master), for commands that can run on the event loop.

use super::RedisClient;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisFuture, RedisResult, Value};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A worker's connection: one server's, or a cluster's. A cluster's pipelines must stay
/// within one slot (the cluster client sends them whole to one node).
#[derive(Clone)]
pub(crate) enum AsyncConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl AsyncConn {
    /// Runs a pipeline. On a cluster a multiplexed connection sends a pipeline whole to one
    /// node, so the commands are grouped by their key's slot, the groups sent at once (their
    /// replies come back as they come: about one round trip for all), and the answers put back
    /// in the order sent; a lone command is routed by the cluster client itself (an MGET or DEL
    /// over many slots split and joined), and a transaction goes whole to its first key's
    /// slot (its keys must share it). Do not `ignore()` commands: on a cluster their answers
    /// are kept.
    pub(crate) async fn query_pipe<T: FromRedisValue>(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> RedisResult<T> {
        let c = match self {
            AsyncConn::Single(c) => return pipe.query_async(c).await,
            AsyncConn::Cluster(c) => c,
        };
        let cmds: Vec<&Cmd> = pipe.cmd_iter().collect();
        if pipe.is_transaction() {
            return pipe.query_async(c).await;
        }
        if let [one] = cmds[..] {
            let v: Value = one.query_async(c).await?;
            return redis::from_redis_value(Value::Array(vec![v])).map_err(Into::into);
        }
        let by_slot = cmds
            .iter()
            .map(|cmd| (super::slot(first_key(cmd)), (*cmd).clone()));
        let values = send_by_slot(c, by_slot, SlotPipes::default()).await?;
        redis::from_redis_value(Value::Array(values)).map_err(Into::into)
    }
}

impl AsyncConn {
    /// [`AsyncConn::query_pipe_each`] when `each`, else [`AsyncConn::query_pipe`].
    pub(crate) async fn query_values(
        &mut self,
        pipe: &redis::Pipeline,
        each: bool,
    ) -> RedisResult<Vec<Value>> {
        if each {
            self.query_pipe_each(pipe).await
        } else {
            self.query_pipe(pipe).await
        }
    }

    /// [`AsyncConn::query_pipe`] for a pipeline built with `ignore_errors()`: each command's
    /// own error is its answer (a `Value::ServerError`), on a cluster too, where the pipeline
    /// is split by slot and the flag would be lost.
    pub(crate) async fn query_pipe_each(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> RedisResult<Vec<Value>> {
        match self {
            AsyncConn::Single(c) => pipe.query_async(c).await,
            AsyncConn::Cluster(c) => {
                let keep = SlotPipes {
                    keep_errors: true,
                    atomic: false,
                };
                let by_slot = pipe
                    .cmd_iter()
                    .map(|cmd| (super::slot(first_key(cmd)), cmd.clone()));
                send_by_slot(c, by_slot, keep).await
            }
        }
    }
}

/// How the per-slot pipelines of [`send_by_slot`] are sent.
#[derive(Default, Clone, Copy)]
pub(crate) struct SlotPipes {
    /// Each command's error is its answer (`Pipeline::ignore_errors`), not the whole call's.
    pub keep_errors: bool,
    /// Each pipeline is one MULTI/EXEC.
    pub atomic: bool,
}

/// Sends commands tagged with their hash slot on a cluster connection: one pipeline per slot,
/// all at once (each goes whole to its slot's master), and the answers in the order given.
pub(crate) async fn send_by_slot(
    conn: &ClusterConnection,
    cmds: impl Iterator<Item = (u16, Cmd)>,
    how: SlotPipes,
) -> RedisResult<Vec<Value>> {
    let mut groups: Vec<(u16, redis::Pipeline, Vec<usize>)> = Vec::new();
    let mut n = 0;
    for (i, (slot, cmd)) in cmds.enumerate() {
        let at = match groups.iter().position(|(s, _, _)| *s == slot) {
            Some(at) => at,
            None => {
                let mut pipe = redis::pipe();
                if how.keep_errors {
                    pipe.ignore_errors();
                }
                if how.atomic {
                    pipe.atomic();
                }
                groups.push((slot, pipe, Vec::new()));
                groups.len() - 1
            }
        };
        groups[at].1.add_command(cmd);
        groups[at].2.push(i);
        n = i + 1;
    }
    let sent = groups.iter().map(|(_, pipe, _)| {
        let mut c = conn.clone();
        async move { pipe.query_async::<Vec<Value>>(&mut c).await }
    });
    let answers = futures_util::future::join_all(sent).await;
    let mut values = vec![Value::Nil; n];
    for ((_, _, at), answer) in groups.iter().zip(answers) {
        for (i, v) in at.iter().zip(answer?) {
            values[*i] = v;
        }
    }
    Ok(values)
}

/// The key a command is routed by: the first after the name, or for EVAL the first of its keys.
fn first_key(cmd: &Cmd) -> &[u8] {
    let arg = |i: usize| match cmd.args_iter().nth(i) {
        Some(redis::Arg::Simple(bytes)) => bytes,
        _ => &[],
    };
    if arg(0).eq_ignore_ascii_case(b"EVAL") || arg(0).eq_ignore_ascii_case(b"EVALSHA") {
        arg(3)
    } else {
        arg(1)
    }
}

impl redis::aio::ConnectionLike for AsyncConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AsyncConn::Single(c) => c.req_packed_command(cmd),
            AsyncConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            AsyncConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            AsyncConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AsyncConn::Single(c) => c.get_db(),
            AsyncConn::Cluster(c) => c.get_db(),
        }
    }
}

/// One multiplexed async connection per actix worker, for commands that can run on the event
/// loop: no thread hop, no pool checkout, and the commands of concurrent requests share the
/// connection, pipelined. At most `max` are open (they count against `redis.pool_size`; the
/// r2d2 pool gets the rest); a worker without one uses the pool.
pub(crate) struct AsyncRedis {
    /// Tells this sidecar's connections apart from another's on the same thread (tests).
    id: u64,
    client: RedisClient,
    config: AsyncConnectionConfig,
    open: Arc<AtomicUsize>,
    max: usize,
}

/// A worker's connection, the failure generation it was opened in, and its slot.
struct Held {
    id: u64,
    generation: u64,
    conn: AsyncConn,
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
    pub(crate) fn new(
        client: RedisClient,
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

    /// This worker's connection, opened on first use; None when every slot is taken. One
    /// opened before failure `generation` is replaced.
    pub(crate) async fn conn(&self, generation: u64) -> RedisResult<Option<AsyncConn>> {
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
        let conn = match &self.client {
            RedisClient::Single(c) => AsyncConn::Single(
                c.get_multiplexed_async_connection_with_config(&self.config)
                    .await?,
            ),
            // Timeouts are the cluster client's own (`store_client`).
            RedisClient::Cluster(c) => AsyncConn::Cluster(c.get_async_connection().await?),
        };
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
    pub(crate) fn drop_conn(&self) {
        HELD.with(|h| h.borrow_mut().retain(|c| c.id != self.id));
    }
}

//! A TCP proxy that adds a fixed one-way delay in each direction: the "edge <-> data centre"
//! link. Loopback has no round trip to speak of, so without it every comparison is moot; the
//! kernel here has no netem. Bandwidth is not limited: each chunk is forwarded `delay` after it
//! was read, in order.
//!
//! The kernel completes a client's TCP handshake with the proxy locally, so the proxy charges
//! it instead: nothing the client sends in its first round trip is delivered before one RTT
//! has passed since the connection was accepted (SYN, SYN-ACK), then the one-way delay.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub struct LatencyProxy {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `target` with `rtt / 2` each way.
    pub async fn start(target: SocketAddr, rtt: Duration) -> std::io::Result<LatencyProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let one_way = rtt / 2;
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let handshake_done = Instant::now() + rtt;
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::join!(
                            pipe(cr, sw, one_way, handshake_done),
                            pipe(sr, cw, one_way, Instant::now())
                        );
                    }
                });
            }
        });
        Ok(LatencyProxy { addr, task })
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies one direction, each chunk delivered `delay` after it was read (or after
/// `not_before`, when it was read earlier).
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    not_before: Instant,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            crate::precise_sleep::until(due.into_std()).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let sent = Instant::now().max(not_before);
                    if tx.send((sent + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

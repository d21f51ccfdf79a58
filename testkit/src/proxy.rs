//! A TCP proxy between the sidecar and Redis or Postgres that a test can break in two ways:
//! cut (every live connection closed at once, as in a network partition, and new ones refused
//! until healed) or reset (every live connection aborted with a TCP RST and no FIN, as a NAT,
//! load balancer or pooler in between does when it drops its state; new ones still go through).
//! It can also mute: the server's replies are dropped on the way while requests still reach
//! it, so a command runs and its caller never hears of it. And it can be pointed elsewhere
//! (a failover, or a DNS name moved): new connections go to the new address.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct CutProxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    muted: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<Link>>>,
    target: Arc<Mutex<SocketAddr>>,
}

/// One proxied connection: the client's side, the server's side, and whether it is being
/// reset (its forwarding threads then end without closing the client's side politely).
struct Link {
    client: TcpStream,
    server: TcpStream,
    reset: Arc<AtomicBool>,
}

impl CutProxy {
    pub fn start(target: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let cut = Arc::new(AtomicBool::new(false));
        let muted = Arc::new(AtomicBool::new(false));
        let live: Arc<Mutex<Vec<Link>>> = Arc::default();
        let target = Arc::new(Mutex::new(target));
        let (c, l, m, t) = (cut.clone(), live.clone(), muted.clone(), target.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if c.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let to = *t.lock().expect("target");
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let reset = Arc::new(AtomicBool::new(false));
                if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                    if let Ok(mut live) = l.lock() {
                        live.push(Link {
                            client: c2,
                            server: s2,
                            reset: reset.clone(),
                        });
                    }
                }
                for (mut from, mut to, replies) in [
                    (client.try_clone(), server.try_clone(), false),
                    (server.try_clone(), client.try_clone(), true),
                ]
                .into_iter()
                .filter_map(|(a, b, r)| Some((a.ok()?, b.ok()?, r)))
                {
                    let (reset, muted) = (reset.clone(), m.clone());
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            if replies && muted.load(Ordering::SeqCst) {
                                continue;
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        if !reset.load(Ordering::SeqCst) {
                            let _ = to.shutdown(Shutdown::Both);
                        }
                    });
                }
            }
        });
        CutProxy {
            addr,
            cut,
            muted,
            live,
            target,
        }
    }

    /// New connections go to `to` from now on; live ones stay where they are.
    pub fn retarget(&self, to: SocketAddr) {
        *self.target.lock().expect("target") = to;
    }

    /// Drops the server's replies from now on (until [`CutProxy::unmute`]); what clients send
    /// still reaches it.
    pub fn mute(&self) {
        self.muted.store(true, Ordering::SeqCst);
    }

    /// Forwards replies again.
    pub fn unmute(&self) {
        self.muted.store(false, Ordering::SeqCst);
    }

    /// Drops every live connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for link in self.take_live() {
            let _ = link.client.shutdown(Shutdown::Both);
            let _ = link.server.shutdown(Shutdown::Both);
        }
    }

    /// Aborts every live connection: the client gets a TCP RST (no FIN first), so its next
    /// write or read fails with "connection reset" or "broken pipe", not an orderly end of
    /// stream. The server's side is closed. New connections go through as before.
    pub fn reset(&self) {
        for link in self.take_live() {
            link.reset.store(true, Ordering::SeqCst);
            // Linger 0: the socket's last close sends RST. Shutting its reading side sends
            // nothing to the client and wakes the thread reading it; closing the server's side
            // wakes the other. Both then drop their handles, and this one is dropped here.
            socket2::SockRef::from(&link.client)
                .set_linger(Some(Duration::ZERO))
                .expect("SO_LINGER 0 on a proxied connection");
            let _ = link.client.shutdown(Shutdown::Read);
            let _ = link.server.shutdown(Shutdown::Both);
        }
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    fn take_live(&self) -> Vec<Link> {
        self.live
            .lock()
            .map(|mut live| live.drain(..).collect())
            .unwrap_or_default()
    }
}

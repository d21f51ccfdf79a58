//! The Upstash door's own connections to its Redis (`upstash.redis_url`, else `redis.url`):
//! plain TCP or TLS, authenticated as the URL's user or as a token's script user, their replies
//! read within a byte budget (`wire`). Apart from the cache's connections on purpose: a slow or
//! oversized reply, a script, a refused command here never opens the cache's breaker, and the
//! door's work never waits behind the cache's.
//!
//! At most `upstash.pool_size` connections at once, all users together; idle ones are kept per
//! user. A connection is given back only after a complete exchange: one that failed, timed out
//! or met the budget mid-reply is closed (its framing is unknown).

use super::wire::{self, Reply, WireError};
use crate::config::Config;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Semaphore;

/// Commands sent before their replies are read: enough to hide the round trip on a pipeline,
/// few enough that Redis never buffers many oversized replies for a reader that will stop.
const WINDOW: usize = 16;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Where the door's Redis is and how to reach it.
#[derive(Clone)]
struct Target {
    host: String,
    port: u16,
    /// TLS, with the roots to verify the server by.
    tls: Option<Arc<rustls::ClientConfig>>,
    db: i64,
    /// The URL's own user and password (None: no AUTH).
    auth: Option<(Option<String>, String)>,
    connect_timeout: Duration,
    io_timeout: Duration,
}

/// One connection.
pub(crate) struct Conn {
    io: BufReader<Box<dyn Io>>,
    user: String,
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Fault {
    /// The caller asked for a reply past `limits.max_read_bytes`.
    #[error("the reply is larger than limits.max_read_bytes ({0} bytes)")]
    TooLarge(usize),
    /// Nothing was sent (no connection, or every slot busy past the timeout).
    #[error("redis is unavailable: {0}")]
    Unavailable(String),
    /// Sent, and no complete answer: the commands may have run.
    #[error("redis did not answer: {0}")]
    Lost(String),
}

pub(crate) struct Conns {
    target: Option<Target>,
    slots: Arc<Semaphore>,
    idle: Mutex<HashMap<String, Vec<Conn>>>,
}

impl Conns {
    /// For `config` (None target when the URL cannot be used: every exchange is then refused
    /// as unavailable; `startup::check_config` names the key at startup).
    pub(crate) fn new(config: &Config) -> Conns {
        Conns {
            target: target(config).ok(),
            slots: Arc::new(Semaphore::new(config.upstash.pool_size.max(1))),
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `commands` in one write as `user` (None: the URL's own user) and reads their
    /// replies within `budget` bytes, all of it within `deadline`. `repeatable`: nothing in
    /// them writes, so on a kept connection Redis had closed meanwhile (its idle `timeout`, a
    /// restart) they are sent once more on a new one.
    pub(crate) async fn exchange(
        &self,
        user: Option<(&str, &str)>,
        commands: &[&[Vec<u8>]],
        budget: usize,
        deadline: Duration,
        repeatable: bool,
    ) -> Result<Vec<Reply>, Fault> {
        match self.once(user, commands, budget, deadline).await {
            Err((Fault::Lost(_), true)) if repeatable => self
                .once(user, commands, budget, deadline)
                .await
                .map_err(|(f, _)| f),
            out => out.map_err(|(f, _)| f),
        }
    }

    /// One exchange; on failure, whether the connection was a kept one.
    async fn once(
        &self,
        user: Option<(&str, &str)>,
        commands: &[&[Vec<u8>]],
        budget: usize,
        deadline: Duration,
    ) -> Result<Vec<Reply>, (Fault, bool)> {
        let fresh = |f: Fault| (f, false);
        let target = self
            .target
            .as_ref()
            .ok_or_else(|| fresh(Fault::Unavailable("upstash.redis_url is not usable".into())))?;
        let _slot =
            tokio::time::timeout(target.connect_timeout, self.slots.clone().acquire_owned())
                .await
                .map_err(|_| fresh(Fault::Unavailable("every connection is in use".into())))?
                .map_err(|_| fresh(Fault::Unavailable("closed".into())))?;
        let name = user.map_or("", |(u, _)| u);
        let idle = self.lock().get_mut(name).and_then(Vec::pop);
        let kept = idle.is_some();
        let mut conn = match idle {
            Some(c) => c,
            None => connect(target, user).await.map_err(fresh)?,
        };
        let exchanged = tokio::time::timeout(deadline, async {
            let mut left = budget;
            let mut replies = Vec::with_capacity(commands.len());
            // Sent a window at a time: Redis holds at most one window's replies for us, and a
            // pipeline past the budget stops being sent where the budget ran out.
            let mut out = Vec::new();
            for window in commands.chunks(WINDOW) {
                out.clear();
                wire::encode(window, &mut out);
                conn.io.get_mut().write_all(&out).await?;
                conn.io.get_mut().flush().await?;
                for _ in window {
                    replies.push(wire::read(&mut conn.io, &mut left, budget).await?);
                }
            }
            Ok::<_, WireError>(replies)
        })
        .await;
        match exchanged {
            Ok(Ok(replies)) => {
                self.lock().entry(conn.user.clone()).or_default().push(conn);
                Ok(replies)
            }
            Ok(Err(WireError::TooLarge(n))) => Err((Fault::TooLarge(n), kept)),
            Ok(Err(e)) => Err((Fault::Lost(e.to_string()), kept)),
            // A deadline is not a closed connection: never sent again.
            Err(_) => Err((Fault::Lost("no answer before the deadline".into()), false)),
        }
    }

    /// Forgets every idle connection (a reload may have changed the script users' passwords).
    pub(crate) fn forget_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Conn>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The door's Redis from the config: `upstash.redis_url`, else `redis.url` (a single server;
/// on a cluster the door goes through the cluster client instead, `upstash::cluster`).
fn target(config: &Config) -> Result<Target, String> {
    let url = match config.upstash.redis_url.as_str() {
        "" => config.redis.url.as_str(),
        own => own,
    };
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|_| "not a valid redis:// or rediss:// URL".to_string())?;
    let (host, port, tls) = match info.addr() {
        redis::ConnectionAddr::Tcp(h, p) => (h.clone(), *p, None),
        redis::ConnectionAddr::TcpTls { host, port, .. } => (
            host.clone(),
            *port,
            Some(tls_config(&config.redis.tls_ca_path)?),
        ),
        _ => return Err("unix sockets are not supported here".into()),
    };
    let s = info.redis_settings();
    let auth = s
        .password()
        .map(|p| (s.username().map(str::to_string), p.to_string()));
    Ok(Target {
        host,
        port,
        tls,
        db: s.db(),
        auth,
        connect_timeout: Duration::from_millis(config.redis.connect_timeout_ms),
        io_timeout: Duration::from_millis(config.redis.io_timeout_ms),
    })
}

fn tls_config(ca_path: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    if ca_path.is_empty() {
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
    } else {
        let certs = CertificateDer::pem_file_iter(ca_path)
            .and_then(|i| i.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("redis.tls_ca_path {ca_path}: {e}"))?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("redis.tls_ca_path {ca_path}: {e}"))?;
        }
    }
    crate::tls::install_crypto_provider();
    Ok(Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// A new connection, authenticated (as `user`, or as the URL's) and on the URL's database.
async fn connect(t: &Target, user: Option<(&str, &str)>) -> Result<Conn, Fault> {
    let unavailable = |e: String| Fault::Unavailable(e);
    let tcp = tokio::time::timeout(
        t.connect_timeout,
        tokio::net::TcpStream::connect((t.host.as_str(), t.port)),
    )
    .await
    .map_err(|_| unavailable("connect timeout".into()))?
    .map_err(|e| unavailable(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = match &t.tls {
        None => Box::new(tcp),
        Some(tls) => {
            let name = rustls::pki_types::ServerName::try_from(t.host.clone())
                .map_err(|e| unavailable(e.to_string()))?;
            let stream = tokio::time::timeout(
                t.connect_timeout,
                tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp),
            )
            .await
            .map_err(|_| unavailable("TLS handshake timeout".into()))?
            .map_err(|e| unavailable(e.to_string()))?;
            Box::new(stream)
        }
    };
    let mut conn = Conn {
        io: BufReader::new(io),
        user: user.map_or(String::new(), |(u, _)| u.to_string()),
    };
    let mut hello: Vec<Vec<Vec<u8>>> = Vec::new();
    match (user, &t.auth) {
        (Some((u, p)), _) => hello.push(vec![b"AUTH".to_vec(), u.into(), p.into()]),
        (None, Some((Some(u), p))) => hello.push(vec![
            b"AUTH".to_vec(),
            u.as_bytes().into(),
            p.as_bytes().into(),
        ]),
        (None, Some((None, p))) => hello.push(vec![b"AUTH".to_vec(), p.as_bytes().into()]),
        (None, None) => {}
    }
    if t.db != 0 {
        hello.push(vec![b"SELECT".to_vec(), t.db.to_string().into_bytes()]);
    }
    if hello.is_empty() {
        return Ok(conn);
    }
    let commands: Vec<&[Vec<u8>]> = hello.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    wire::encode(&commands, &mut out);
    let answered = tokio::time::timeout(t.io_timeout, async {
        conn.io.get_mut().write_all(&out).await?;
        let mut left = 4096;
        let mut replies = Vec::new();
        for _ in &commands {
            replies.push(wire::read(&mut conn.io, &mut left, 4096).await?);
        }
        Ok::<_, WireError>(replies)
    })
    .await
    .map_err(|_| unavailable("no answer to AUTH".into()))?
    .map_err(|e| unavailable(e.to_string()))?;
    if let Some(Reply::Error(e)) = answered.iter().find(|r| matches!(r, Reply::Error(_))) {
        return Err(unavailable(format!("refused: {e}")));
    }
    Ok(conn)
}

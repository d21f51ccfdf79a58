//! Just enough of the Redis protocol for "a fresh connection per request": AUTH, GET, SET.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

pub struct Conn<S = TcpStream> {
    stream: BufReader<S>,
}

impl Conn {
    pub async fn connect(addr: std::net::SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Conn {
            stream: BufReader::new(s),
        })
    }
}

impl Conn<TlsStream<TcpStream>> {
    /// A fresh connection with the TLS handshake, as a hosted Redis (rediss://) requires.
    pub async fn connect_tls(
        addr: std::net::SocketAddr,
        tls: &TlsConnector,
    ) -> std::io::Result<Conn<TlsStream<TcpStream>>> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let s = tls.connect(name, s).await?;
        Ok(Conn {
            stream: BufReader::new(s),
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Sends one command and reads its reply: Ok(bytes) for a value (empty for nil/status),
    /// Err(message) for a Redis error reply or a broken connection.
    pub async fn cmd(&mut self, parts: &[&[u8]]) -> Result<Vec<u8>, String> {
        let mut out = format!("*{}\r\n", parts.len()).into_bytes();
        for p in parts {
            out.extend(format!("${}\r\n", p.len()).as_bytes());
            out.extend_from_slice(p);
            out.extend(b"\r\n");
        }
        self.stream
            .get_mut()
            .write_all(&out)
            .await
            .map_err(|e| e.to_string())?;
        self.stream
            .get_mut()
            .flush()
            .await
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        let n = self
            .stream
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        match line.as_bytes().first() {
            Some(b'-') => Err(line.trim_end().to_string()),
            Some(b'$') => {
                let len: i64 = line[1..].trim().parse().map_err(|_| "bad bulk length")?;
                if len < 0 {
                    return Ok(Vec::new());
                }
                let mut buf = vec![0u8; len as usize + 2];
                self.stream
                    .read_exact(&mut buf)
                    .await
                    .map_err(|e| e.to_string())?;
                buf.truncate(len as usize);
                Ok(buf)
            }
            _ => Ok(Vec::new()),
        }
    }
}

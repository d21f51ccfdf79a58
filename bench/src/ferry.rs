//! A signed async client for the sidecar (what the edge does, from native code).

use ferry_shared::sign;
use rand::Rng;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone)]
pub struct Ferry {
    base: String,
    http: reqwest::Client,
}

impl Ferry {
    /// `base` is the address to call (the latency proxy in front of the sidecar, or the sidecar).
    pub fn new(base: String, max_idle: usize) -> Ferry {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(max_idle)
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        Ferry { base, http }
    }

    /// The same over HTTPS, trusting `root` (the edge -> sidecar path with TLS, kept alive).
    pub fn https(base: String, max_idle: usize, root: reqwest::Certificate) -> Ferry {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(max_idle)
            .tcp_nodelay(true)
            .add_root_certificate(root)
            .https_only(true)
            .build()
            .expect("HTTPS client");
        Ferry { base, http }
    }

    /// One signed POST; Ok(body) for 2xx, Err(description) otherwise.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let bytes = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let resp = self.send(path, bytes).await?;
        let status = resp.status();
        let body: Value = resp.json().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    }

    /// One signed POST of a body already serialized, for load loops and timings: Ok(the
    /// answer's length in bytes) for a 2xx whose body arrived whole. The body is read, not
    /// parsed, as the webdis load reads webdis's answers, so that the load generator's own
    /// cost stays the same for both servers.
    pub async fn post_raw(&self, path: &str, bytes: Vec<u8>) -> Result<usize, String> {
        let resp = self.send(path, bytes).await?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(body.len())
        } else {
            Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
        }
    }

    /// Signs `bytes` for `path` and sends them.
    async fn send(&self, path: &str, bytes: Vec<u8>) -> Result<reqwest::Response, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let nonce = hex::encode(rand::thread_rng().gen::<[u8; 16]>());
        let h = sign::sign(
            super::env::SECRET.as_bytes(),
            now,
            &nonce,
            "POST",
            path,
            &bytes,
        );
        self.http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header(sign::HEADER_TIMESTAMP, h.timestamp)
            .header(sign::HEADER_NONCE, h.nonce)
            .header(sign::HEADER_SIGNATURE, h.signature)
            .body(bytes)
            .send()
            .await
            .map_err(|e| e.to_string())
    }
}

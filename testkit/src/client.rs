//! A signing HTTP client for the sidecar, built on ferry-shared's signing code.

use ferry_shared::sign;
use rand::Rng;
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Blocking methods for simple steps, `*_async` ones plus [`Client::block_on`] for
/// concurrency. Tests are plain `#[test]`s: the harness' Postgres and Redis clients are
/// blocking and must not run inside an async runtime.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub secret: Vec<u8>,
    pub http: reqwest::Client,
    rt: std::sync::Arc<tokio::runtime::Runtime>,
}

/// One answer: status, headers and the JSON body (Null if the body was not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// The error code of an error body, or "" for a success body.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

pub fn nonce() -> String {
    let bytes: [u8; 16] = rand::thread_rng().gen();
    hex::encode(bytes)
}

impl Client {
    pub fn new(base: &str, secret: &str) -> Client {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        Client {
            rt: std::sync::Arc::new(rt),
            base: base.to_string(),
            secret: secret.as_bytes().to_vec(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(64)
                .build()
                .expect("http client"),
        }
    }

    /// Signature headers for a request, with any timestamp and nonce.
    pub fn headers_for(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        timestamp: u64,
        nonce: &str,
    ) -> Vec<(&'static str, String)> {
        let h = sign::sign(&self.secret, timestamp, nonce, method, path, body);
        vec![
            (sign::HEADER_TIMESTAMP, h.timestamp),
            (sign::HEADER_NONCE, h.nonce),
            (sign::HEADER_SIGNATURE, h.signature),
        ]
    }

    /// Signature headers for a request signed now, with a fresh nonce.
    pub fn signed_now(&self, method: &str, path: &str, body: &[u8]) -> Vec<(&'static str, String)> {
        self.headers_for(method, path, body, now_s(), &nonce())
    }

    /// Whether `/readyz` answers 200; a refused connection is "not yet", not a failure.
    pub async fn ready(&self) -> bool {
        let url = format!("{}/readyz", self.base);
        matches!(self.http.get(url).send().await, Ok(r) if r.status() == 200)
    }

    /// Sends raw bytes with the given headers (no signing).
    pub async fn send_raw(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, String)],
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .header("content-type", "application/json")
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let resp = req.send().await.expect("request reaches the sidecar");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("read body");
        Answer {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    /// A correctly signed POST of `body` (serialized to JSON).
    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        self.post_bytes(path, serde_json::to_vec(body).expect("json"))
            .await
    }

    pub async fn post_bytes(&self, path: &str, body: Vec<u8>) -> Answer {
        let headers = self.signed_now("POST", path, &body);
        self.send_raw("POST", path, body, &headers).await
    }

    pub async fn query_async(&self, body: Value) -> Answer {
        self.post("/v1/query", &body).await
    }

    /// Runs a future (e.g. many requests joined) to completion.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub fn get(&self, path: &str) -> Answer {
        self.block_on(self.send_raw("GET", path, Vec::new(), &[]))
    }

    pub fn query(&self, body: Value) -> Answer {
        self.block_on(self.post("/v1/query", &body))
    }

    pub fn execute(&self, body: Value) -> Answer {
        self.block_on(self.post("/v1/execute", &body))
    }

    pub fn cache(&self, body: Value) -> Answer {
        self.block_on(self.post("/v1/cache", &body))
    }

    /// A raw request with explicit headers, blocking.
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, String)],
    ) -> Answer {
        self.block_on(self.send_raw(method, path, body, headers))
    }
}

//! The typed sidecar client: every call is signed, bounded by a timeout, and every failure
//! becomes an [`EdgeError`]. Building calls and reading answers is pure (tested natively); only
//! [`SidecarClient`] does I/O, with the Workers `fetch`, on wasm32.

use crate::config::EdgeConfig;
use crate::error::EdgeError;
use ferry_shared::sign;
use ferry_shared::{ErrorBody, ErrorCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// One HTTP request to the sidecar, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The HTTP method.
    pub method: &'static str,
    /// The sidecar URL and path.
    pub url: String,
    /// Content type and the three signature headers.
    pub headers: Vec<(&'static str, String)>,
    /// The JSON body (empty for GET).
    pub body: Vec<u8>,
}

/// Builds a signed call. `nonce` must be fresh randomness (16+ hex chars).
pub fn build_call<B: Serialize>(
    cfg: &EdgeConfig,
    method: &'static str,
    path: &str,
    body: Option<&B>,
    now_s: u64,
    nonce: &str,
) -> Result<Call, EdgeError> {
    let body = match body {
        Some(b) => serde_json::to_vec(b)
            .map_err(|_| EdgeError::Misconfigured("a request could not be encoded".into()))?,
        None => Vec::new(),
    };
    let s = sign::sign(cfg.secret.as_bytes(), now_s, nonce, method, path, &body);
    Ok(Call {
        method,
        url: format!("{}{path}", cfg.sidecar_url),
        headers: vec![
            ("content-type", "application/json".into()),
            (sign::HEADER_TIMESTAMP, s.timestamp),
            (sign::HEADER_NONCE, s.nonce),
            (sign::HEADER_SIGNATURE, s.signature),
        ],
        body,
    })
}

/// Reads the sidecar's answer: the expected type on 2xx, its error passed through otherwise.
/// A 401 means the sidecar refused *our* signature, which the client cannot fix: it is
/// reported as the edge's misconfiguration (502 `sidecar_auth_failed`), not as a client 401.
pub fn interpret<T: DeserializeOwned>(
    status: u16,
    retry_after: Option<String>,
    body: &[u8],
) -> Result<T, EdgeError> {
    if (200..300).contains(&status) {
        return serde_json::from_slice(body).map_err(|_| EdgeError::BadResponse { status });
    }
    let err: ErrorBody =
        serde_json::from_slice(body).map_err(|_| EdgeError::BadResponse { status })?;
    if status == 401 {
        return Err(EdgeError::AuthFailed);
    }
    if err.error.code.http_status() != status && err.error.code != ErrorCode::Internal {
        // A body whose code does not fit its status is not from a Ferry sidecar.
        return Err(EdgeError::BadResponse { status });
    }
    Err(EdgeError::Sidecar {
        status,
        body: err,
        retry_after,
    })
}

/// What one exchange with the sidecar gave: (status, Retry-After, body), or why there was none.
pub type Exchange = Result<(u16, Option<String>, Vec<u8>), EdgeError>;

/// Whether a read may be sent once more, freshly signed (a new nonce: the same one would be a
/// replay to every sidecar), after `outcome`: the sidecar could not be reached, or a balancer in
/// front of several answered for one (a 502, 503 or 504 without a Ferry error body: the sidecar
/// behind it died or refused the connection). Never after a timeout (the deadline is spent),
/// never after a sidecar's own answer, and never for writes, which the caller must not run twice
/// (a write asks for its outcome instead: `crate::outcome`).
pub fn read_again(outcome: &Exchange) -> bool {
    match outcome {
        Err(EdgeError::Unreachable) => true,
        Ok((status, _, body)) => {
            matches!(status, 502..=504) && serde_json::from_slice::<ErrorBody>(body).is_err()
        }
        Err(_) => false,
    }
}

#[cfg(target_arch = "wasm32")]
pub use wasm::SidecarClient;

#[cfg(target_arch = "wasm32")]
mod wasm {
    use super::*;
    use crate::outcome::{ask_outcome, ended, executed, settle, transacted};
    use ferry_shared::api::{
        paths, BatchRequest, BatchResponse, BeginRequest, BeginResponse, CacheCommand, CacheReply,
        EndRequest, EndResponse, ExecuteRequest, ExecuteResponse, InTransactionRequest, Invalidate,
        KeyedRequest, KeyedResponse, OutcomeRequest, OutcomeResponse, QueryRequest, QueryResponse,
        Readiness, StatementResult, TransactionRequest, TransactionResponse,
    };
    use futures_util::future::{select, Either};
    use std::time::Duration;
    use worker::{
        AbortController, Date, Delay, Fetch, Headers, Method, Request, RequestInit, RequestRedirect,
    };

    /// The signed HTTP client to one sidecar, for one request (its id travels with each call).
    pub struct SidecarClient {
        cfg: EdgeConfig,
        /// Sent as `x-ferry-request-id`, so the sidecar logs this request under the same id.
        request_id: String,
        /// Sent as `x-ferry-affinity` on every call: behind a balancer that hashes on it, an
        /// interactive transaction begun with this client finds its sidecar on every later
        /// call. Random, so callers spread over the sidecars.
        affinity: String,
    }

    fn nonce() -> Result<String, EdgeError> {
        let mut bytes = [0u8; 16];
        getrandom::getrandom(&mut bytes)
            .map_err(|_| EdgeError::Misconfigured("no random source for nonces".into()))?;
        Ok(hex::encode(bytes))
    }

    fn method(m: &str) -> Method {
        match m {
            "GET" => Method::Get,
            "PUT" => Method::Put,
            _ => Method::Post,
        }
    }

    impl SidecarClient {
        /// A client with these bindings, tagging its calls with `request_id`.
        pub fn new(cfg: EdgeConfig, request_id: String) -> Self {
            let affinity = nonce().unwrap_or_else(|_| request_id.clone());
            SidecarClient {
                cfg,
                request_id,
                affinity,
            }
        }

        /// Sends one call and returns (status, Retry-After, body), bounded by the timeout
        /// (the request is aborted when it fires).
        async fn send(&self, call: Call) -> Exchange {
            let headers = Headers::new();
            for (k, v) in &call.headers {
                headers.set(k, v).map_err(|_| EdgeError::Unreachable)?;
            }
            headers
                .set(ferry_shared::api::REQUEST_ID_HEADER, &self.request_id)
                .map_err(|_| EdgeError::Unreachable)?;
            headers
                .set(ferry_shared::api::AFFINITY_HEADER, &self.affinity)
                .map_err(|_| EdgeError::Unreachable)?;
            let mut init = RequestInit::new();
            // A redirect is never followed: fetch would resend a POST as a bodiless GET to
            // wherever it points. It is an answer the edge cannot read (`BadResponse`).
            init.with_method(method(call.method))
                .with_headers(headers)
                .with_redirect(RequestRedirect::Manual);
            if !call.body.is_empty() {
                let text = String::from_utf8_lossy(&call.body).into_owned();
                init.with_body(Some(text.into()));
            }
            let req = Request::new_with_init(&call.url, &init).map_err(|_| {
                EdgeError::Misconfigured("FERRY_SIDECAR_URL is not a valid URL".into())
            })?;
            let controller = AbortController::default();
            let signal = controller.signal();
            let exchange = async move {
                let mut resp = Fetch::Request(req)
                    .send_with_signal(&signal)
                    .await
                    .map_err(|_| EdgeError::Unreachable)?;
                let status = resp.status_code();
                let retry_after = resp.headers().get("retry-after").ok().flatten();
                let body = resp
                    .bytes()
                    .await
                    .map_err(|_| EdgeError::BadResponse { status })?;
                Ok((status, retry_after, body))
            };
            let timer = Delay::from(Duration::from_millis(self.cfg.timeout_ms));
            match select(Box::pin(exchange), timer).await {
                Either::Left((result, _)) => result,
                Either::Right(_) => {
                    controller.abort();
                    Err(EdgeError::Timeout {
                        after_ms: self.cfg.timeout_ms,
                    })
                }
            }
        }

        async fn call<B: Serialize, T: DeserializeOwned>(
            &self,
            verb: &'static str,
            path: &str,
            body: Option<&B>,
        ) -> Result<T, EdgeError> {
            let now_s = Date::now().as_millis() / 1000;
            let call = build_call(&self.cfg, verb, path, body, now_s, &nonce()?)?;
            let (status, retry_after, bytes) = self.send(call).await?;
            interpret(status, retry_after, &bytes)
        }

        /// A read: sent once more, freshly signed, when the first attempt never reached a
        /// sidecar or a balancer answered for a dead one ([`read_again`]).
        async fn read<B: Serialize, T: DeserializeOwned>(
            &self,
            path: &str,
            body: &B,
        ) -> Result<T, EdgeError> {
            let mut attempt = 0;
            loop {
                attempt += 1;
                let now_s = Date::now().as_millis() / 1000;
                let call = build_call(&self.cfg, "POST", path, Some(body), now_s, &nonce()?)?;
                let outcome = self.send(call).await;
                if attempt == 1 && read_again(&outcome) {
                    continue;
                }
                let (status, retry_after, bytes) = outcome?;
                return interpret(status, retry_after, &bytes);
            }
        }

        /// `POST /v1/query`: one read.
        pub async fn query(&self, q: &QueryRequest) -> Result<QueryResponse, EdgeError> {
            self.read(paths::QUERY, q).await
        }

        /// Many reads in one call, each answered on its own.
        pub async fn batch(&self, reads: Vec<QueryRequest>) -> Result<BatchResponse, EdgeError> {
            self.read(paths::BATCH, &BatchRequest { reads }).await
        }

        /// `POST /v1/batch/keyed`: rows of a keyspace by id.
        pub async fn keyed(&self, k: &KeyedRequest) -> Result<KeyedResponse, EdgeError> {
            self.read(paths::BATCH_KEYED, k).await
        }

        /// Sends one write, signed with a nonce it keeps. When no sidecar answered it, or its
        /// sidecar could not learn its outcome ([`ask_outcome`]), a sidecar is asked whether
        /// it committed (`/v1/outcome`, by that nonce, with the write's invalidations), which
        /// is final: a committed write is answered through `committed` (its invalidations
        /// applied by that sidecar), one that had not committed never will, and its error
        /// stands ([`settle`]). Only when no sidecar can be asked either is the error
        /// ambiguous.
        async fn write<B: Serialize, T: DeserializeOwned>(
            &self,
            path: &str,
            body: &B,
            invalidate: Option<Invalidate>,
            committed: fn(OutcomeResponse) -> Result<T, EdgeError>,
        ) -> Result<T, EdgeError> {
            let now_s = Date::now().as_millis() / 1000;
            let signed_with = nonce()?;
            let call = build_call(&self.cfg, "POST", path, Some(body), now_s, &signed_with)?;
            let sent = self.send(call).await;
            let mut asked = None;
            if ask_outcome(&sent) {
                let ask = OutcomeRequest {
                    nonce: signed_with,
                    invalidate,
                };
                asked = self.read(paths::OUTCOME, &ask).await.ok();
            }
            settle(sent, asked, committed)
        }

        /// `POST /v1/execute`: one write, then its invalidations; a lost answer is settled by
        /// the write's outcome ([`SidecarClient::write`]).
        pub async fn execute(&self, e: &ExecuteRequest) -> Result<ExecuteResponse, EdgeError> {
            self.write(paths::EXECUTE, e, e.invalidate.clone(), executed)
                .await
        }

        /// Statements in one transaction (all commit or none); the failing statement's index
        /// comes back in the error (`EdgeError::Sidecar`'s body, `statement`). A lost answer
        /// is settled by the outcome: one that committed is
        /// [`EdgeError::CommittedWithoutResults`], never to be sent again.
        pub async fn transaction(
            &self,
            t: &TransactionRequest,
        ) -> Result<TransactionResponse, EdgeError> {
            self.write(paths::TRANSACTION, t, t.invalidate.clone(), transacted)
                .await
        }

        /// Opens an interactive transaction; end it with `commit` or `rollback` (or the sidecar
        /// rolls it back when idle).
        pub async fn begin(&self, b: &BeginRequest) -> Result<BeginResponse, EdgeError> {
            self.call("POST", paths::TRANSACTION_BEGIN, Some(b)).await
        }

        /// `POST /v1/transaction/query`: one statement in an open transaction.
        pub async fn in_transaction(
            &self,
            q: &InTransactionRequest,
        ) -> Result<StatementResult, EdgeError> {
            self.call("POST", paths::TRANSACTION_QUERY, Some(q)).await
        }

        /// `POST /v1/transaction/commit`: then the invalidations. A lost answer is settled by
        /// the commit's outcome, as a write's.
        pub async fn commit(&self, e: &EndRequest) -> Result<EndResponse, EdgeError> {
            self.write(paths::TRANSACTION_COMMIT, e, e.invalidate.clone(), ended)
                .await
        }

        /// `POST /v1/transaction/rollback`.
        pub async fn rollback(&self, e: &EndRequest) -> Result<EndResponse, EdgeError> {
            self.call("POST", paths::TRANSACTION_ROLLBACK, Some(e))
                .await
        }

        /// `POST /v1/cache`: a plain cache command.
        pub async fn cache(&self, c: &CacheCommand) -> Result<CacheReply, EdgeError> {
            self.call("POST", paths::CACHE, Some(c)).await
        }

        /// `/readyz` answers a `Readiness` body with 200 or 503: both are answers.
        pub async fn readiness(&self) -> Result<Readiness, EdgeError> {
            let call = build_call::<()>(&self.cfg, "GET", paths::READYZ, None, 0, "")?;
            let (status, _, bytes) = self.send(call).await?;
            serde_json::from_slice(&bytes).map_err(|_| EdgeError::BadResponse { status })
        }
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;

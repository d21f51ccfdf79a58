//! The Worker's side: a [`Ferry`] from the Worker's bindings, over the signed HTTP client.

use super::{Calls, Ferry, Transport};
use crate::client::SidecarClient;
use crate::config::{self, EdgeConfig};
use crate::error::EdgeError;
use ferry_shared::api::{
    BatchResult, BeginRequest, BeginResponse, CacheCommand, CacheReply, EndRequest, EndResponse,
    ExecuteRequest, ExecuteResponse, InTransactionRequest, KeyedRequest, KeyedResponse,
    QueryRequest, QueryResponse, Readiness, StatementResult, TransactionRequest,
    TransactionResponse,
};
use futures_util::future::LocalBoxFuture;
use std::rc::Rc;
use worker::Env;

impl Transport for Rc<SidecarClient> {
    fn query(&self, read: QueryRequest) -> LocalBoxFuture<'_, Result<QueryResponse, EdgeError>> {
        Box::pin(async move { SidecarClient::query(self, &read).await })
    }

    fn batch(
        &self,
        reads: Vec<QueryRequest>,
    ) -> LocalBoxFuture<'_, Result<Vec<BatchResult>, EdgeError>> {
        Box::pin(async move { SidecarClient::batch(self, reads).await.map(|b| b.results) })
    }
}

impl Calls for SidecarClient {
    fn execute(
        &self,
        write: ExecuteRequest,
    ) -> LocalBoxFuture<'_, Result<ExecuteResponse, EdgeError>> {
        Box::pin(async move { SidecarClient::execute(self, &write).await })
    }

    fn keyed(&self, read: KeyedRequest) -> LocalBoxFuture<'_, Result<KeyedResponse, EdgeError>> {
        Box::pin(async move { SidecarClient::keyed(self, &read).await })
    }

    fn cache(&self, command: CacheCommand) -> LocalBoxFuture<'_, Result<CacheReply, EdgeError>> {
        Box::pin(async move { SidecarClient::cache(self, &command).await })
    }

    fn transaction(
        &self,
        tx: TransactionRequest,
    ) -> LocalBoxFuture<'_, Result<TransactionResponse, EdgeError>> {
        Box::pin(async move { SidecarClient::transaction(self, &tx).await })
    }

    fn readiness(&self) -> LocalBoxFuture<'_, Result<Readiness, EdgeError>> {
        Box::pin(async move { SidecarClient::readiness(self).await })
    }

    fn begin(&self, b: BeginRequest) -> LocalBoxFuture<'_, Result<BeginResponse, EdgeError>> {
        Box::pin(async move { SidecarClient::begin(self, &b).await })
    }

    fn in_transaction(
        &self,
        q: InTransactionRequest,
    ) -> LocalBoxFuture<'_, Result<StatementResult, EdgeError>> {
        Box::pin(async move { SidecarClient::in_transaction(self, &q).await })
    }

    fn commit(&self, e: EndRequest) -> LocalBoxFuture<'_, Result<EndResponse, EdgeError>> {
        Box::pin(async move { SidecarClient::commit(self, &e).await })
    }

    fn rollback(&self, e: EndRequest) -> LocalBoxFuture<'_, Result<EndResponse, EdgeError>> {
        Box::pin(async move { SidecarClient::rollback(self, &e).await })
    }
}

impl Ferry {
    /// From the Worker's bindings: `FERRY_SIDECAR_URL`, `FERRY_SECRET` (a secret),
    /// `FERRY_TIMEOUT_MS` and `FERRY_ALLOW_HTTP` (optional), and `FERRY_AUTO_BATCH = "false"`
    /// to send every read on its own. `request_id` goes to the sidecar's logs with each call.
    pub fn from_env(env: &Env, request_id: &str) -> Result<Ferry, EdgeError> {
        let var = |name: &str| env.var(name).ok().map(|v| v.to_string());
        let cfg = EdgeConfig::from_bindings(
            var(config::VAR_SIDECAR_URL),
            var(config::VAR_TIMEOUT_MS),
            var(config::VAR_ALLOW_HTTP),
            env.secret(config::SECRET).ok().map(|s| s.to_string()),
        )?;
        let batching = var(config::VAR_AUTO_BATCH).as_deref() != Some("false");
        let client = Rc::new(SidecarClient::new(cfg, request_id.to_string()));
        Ok(Ferry::with_transport(
            Box::new(client.clone()),
            client,
            batching,
        ))
    }
}

//! A handle whose calls are never made, for a Worker's own unit tests: what a handler builds
//! (statements, parameters, cache policies, the end user) can be checked without a sidecar.

use super::{Calls, Ferry, Transport};
use crate::error::EdgeError;
use ferry_shared::api::{
    CacheCommand, CacheReply, ExecuteRequest, ExecuteResponse, KeyedRequest, KeyedResponse,
    QueryRequest, QueryResponse, Readiness, TransactionRequest, TransactionResponse,
};
use futures_util::future::LocalBoxFuture;
use std::rc::Rc;

impl Ferry {
    /// A handle that sends nothing: every call fails with `EdgeError::Misconfigured`, and
    /// every builder still builds. For tests of the requests a handler makes.
    ///
    /// ```
    /// let ferry = ferry_edge::Ferry::offline();
    /// let read = ferry.query("item").bind(7);
    /// assert_eq!(read.request().query.as_deref(), Some("item"));
    /// assert_eq!(read.request().params, vec![serde_json::json!(7)]);
    /// ```
    pub fn offline() -> Ferry {
        Ferry::with_transport(Box::new(Unused), Rc::new(Unused), true)
    }
}

/// Fails every call: for tests that only look at the requests built.
struct Unused;

pub(super) fn no<T>() -> LocalBoxFuture<'static, Result<T, EdgeError>> {
    Box::pin(async { Err(EdgeError::Misconfigured("no calls in this test".into())) })
}

impl Transport for Unused {
    fn query(&self, _: QueryRequest) -> LocalBoxFuture<'_, Result<QueryResponse, EdgeError>> {
        no()
    }
    fn batch(
        &self,
        _: Vec<QueryRequest>,
    ) -> LocalBoxFuture<'_, Result<Vec<ferry_shared::api::BatchResult>, EdgeError>> {
        no()
    }
}

impl Calls for Unused {
    fn execute(&self, _: ExecuteRequest) -> LocalBoxFuture<'_, Result<ExecuteResponse, EdgeError>> {
        no()
    }
    fn keyed(&self, _: KeyedRequest) -> LocalBoxFuture<'_, Result<KeyedResponse, EdgeError>> {
        no()
    }
    fn cache(&self, _: CacheCommand) -> LocalBoxFuture<'_, Result<CacheReply, EdgeError>> {
        no()
    }
    fn transaction(
        &self,
        _: TransactionRequest,
    ) -> LocalBoxFuture<'_, Result<TransactionResponse, EdgeError>> {
        no()
    }
    fn readiness(&self) -> LocalBoxFuture<'_, Result<Readiness, EdgeError>> {
        no()
    }
}

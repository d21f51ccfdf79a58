//! Interactive transactions over a fake sidecar that records every call: what is sent, in
//! what order, and that a transaction never outlives its closure.
use super::*;
use crate::ferry::{Calls, Transport};
use ferry_shared::api::{
    BatchResult, BeginResponse, CacheCommand, CacheReply, ExecuteRequest, ExecuteResponse,
    Identity, InvalidationStatus, KeyedRequest, KeyedResponse, Position, QueryRequest,
    QueryResponse, Readiness, TransactionRequest, TransactionResponse,
};
use ferry_shared::{ErrorBody, ErrorCode};
use futures_util::future::LocalBoxFuture;
use serde_json::json;

/// Records the interactive calls; a statement whose first parameter is "fail" is refused as
/// Postgres would (it aborts the transaction).
#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<String>>,
    ends: RefCell<Vec<EndRequest>>,
    statements: RefCell<Vec<InTransactionRequest>>,
}

fn ready<T: 'static>(v: Result<T, EdgeError>) -> LocalBoxFuture<'static, Result<T, EdgeError>> {
    Box::pin(async move { v })
}

fn none<T: 'static>() -> LocalBoxFuture<'static, Result<T, EdgeError>> {
    ready(Err(EdgeError::Misconfigured("not in this test".into())))
}

impl Transport for Rc<Recorder> {
    fn query(&self, _: QueryRequest) -> LocalBoxFuture<'_, Result<QueryResponse, EdgeError>> {
        none()
    }
    fn batch(
        &self,
        _: Vec<QueryRequest>,
    ) -> LocalBoxFuture<'_, Result<Vec<BatchResult>, EdgeError>> {
        none()
    }
}

impl Calls for Recorder {
    fn execute(&self, _: ExecuteRequest) -> LocalBoxFuture<'_, Result<ExecuteResponse, EdgeError>> {
        none()
    }
    fn keyed(&self, _: KeyedRequest) -> LocalBoxFuture<'_, Result<KeyedResponse, EdgeError>> {
        none()
    }
    fn cache(&self, _: CacheCommand) -> LocalBoxFuture<'_, Result<CacheReply, EdgeError>> {
        none()
    }
    fn transaction(
        &self,
        _: TransactionRequest,
    ) -> LocalBoxFuture<'_, Result<TransactionResponse, EdgeError>> {
        none()
    }
    fn readiness(&self) -> LocalBoxFuture<'_, Result<Readiness, EdgeError>> {
        none()
    }
    fn begin(&self, b: BeginRequest) -> LocalBoxFuture<'_, Result<BeginResponse, EdgeError>> {
        self.calls
            .borrow_mut()
            .push(format!("begin read_only={}", b.read_only));
        ready(Ok(BeginResponse {
            id: "t1".into(),
            idle_timeout_ms: 5_000,
            max_lifetime_ms: 30_000,
        }))
    }
    fn in_transaction(
        &self,
        q: InTransactionRequest,
    ) -> LocalBoxFuture<'_, Result<StatementResult, EdgeError>> {
        self.calls
            .borrow_mut()
            .push(format!("{} in {}", q.query.as_deref().unwrap_or("?"), q.id));
        let fail = q.params.first() == Some(&json!("fail"));
        self.statements.borrow_mut().push(q);
        if fail {
            let body = ErrorBody::new(ErrorCode::SqlError, "refused");
            return ready(Err(EdgeError::from_detail(body.error)));
        }
        let row = [("price".to_string(), json!("8.75"))].into_iter().collect();
        ready(Ok(StatementResult {
            rows_affected: 1,
            rows: vec![row],
        }))
    }
    fn commit(&self, e: EndRequest) -> LocalBoxFuture<'_, Result<EndResponse, EdgeError>> {
        self.calls.borrow_mut().push(format!("commit {}", e.id));
        self.ends.borrow_mut().push(e);
        ready(Ok(EndResponse {
            committed: true,
            invalidation: InvalidationStatus::Done,
            position: Some(Position(0x900)),
        }))
    }
    fn rollback(&self, e: EndRequest) -> LocalBoxFuture<'_, Result<EndResponse, EdgeError>> {
        self.calls.borrow_mut().push(format!("rollback {}", e.id));
        self.ends.borrow_mut().push(e);
        ready(Ok(EndResponse {
            committed: false,
            invalidation: InvalidationStatus::None,
            position: None,
        }))
    }
}

fn ferry() -> (Ferry, Rc<Recorder>) {
    let r = Rc::new(Recorder::default());
    (
        Ferry::with_transport(Box::new(r.clone()), r.clone(), false),
        r,
    )
}

#[derive(Debug, serde::Deserialize)]
struct Price {
    price: String,
}

#[test]
fn an_ok_commits_with_its_invalidations_and_moves_the_position() {
    let (f, r) = ferry();
    let user = Identity {
        role: "authenticated".into(),
        claims: [("sub".to_string(), json!("u1"))].into_iter().collect(),
    };
    let f = f.as_user(user.clone());
    let (old, end) = futures::executor::block_on(f.begin().run(|tx| async move {
        let p: Price = tx.statement("item_for_update").bind(7).fetch_one().await?;
        let n = tx.statement("set_price").bind(7).bind("9.63").run().await?;
        tx.invalidate_key("items:7");
        Ok((p.price, n))
    }))
    .expect("committed");
    assert_eq!(old, ("8.75".to_string(), 1));
    assert!(end.committed);
    assert_eq!(
        *r.calls.borrow(),
        [
            "begin read_only=false",
            "item_for_update in t1",
            "set_price in t1",
            "commit t1"
        ]
    );
    let ends = r.ends.borrow();
    let keys = ends[0].invalidate.as_ref().map(|i| i.keys.clone());
    assert_eq!(keys, Some(vec!["items:7".to_string()]));
    // Every call of it runs as the same user, or the sidecar finds no such transaction.
    assert_eq!(ends[0].identity.as_ref(), Some(&user));
    let statements = r.statements.borrow();
    assert!(statements
        .iter()
        .all(|s| s.identity.as_ref() == Some(&user)));
    assert_eq!(statements[1].params, [json!(7), json!("9.63")]);
    assert_eq!(f.position(), Some(Position(0x900)));
}

#[test]
fn an_err_rolls_back_at_once_and_is_returned() {
    let (f, r) = ferry();
    let e = futures::executor::block_on(f.begin().read_only().run(|tx| async move {
        tx.statement("set_price").bind("fail").run().await?;
        tx.statement("never_sent").run().await?;
        Ok(())
    }))
    .expect_err("refused");
    assert_eq!(e.code(), ErrorCode::SqlError);
    assert_eq!(
        *r.calls.borrow(),
        ["begin read_only=true", "set_price in t1", "rollback t1"]
    );
    // The Worker's own "no" rolls back too: no row is 404, and nothing stays open.
    let (f, r) = ferry();
    let e = futures::executor::block_on(f.begin().run(|tx| async move {
        let none: Vec<Price> = Vec::new();
        tx.invalidate_key("items:7");
        none.into_iter()
            .next()
            .ok_or_else(|| EdgeError::NotFound("no item 7".into()))
    }))
    .expect_err("not found");
    assert_eq!(e.status(), 404);
    assert_eq!(*r.calls.borrow(), ["begin read_only=false", "rollback t1"]);
    assert_eq!(
        r.ends.borrow()[0].invalidate,
        None,
        "a rollback invalidates nothing"
    );
    assert_eq!(f.position(), None);
}

//! The library over fake transports: what it sends, and what it keeps between calls.
use super::*;
use ferry_shared::api::QueryResponse;
use offline::no;

/// Answers writes with a position and reads with no rows, keeping the reads it was sent.
#[derive(Default)]
struct Positions {
    reads: std::cell::RefCell<Vec<QueryRequest>>,
}

impl Transport for Positions {
    fn query(&self, q: QueryRequest) -> LocalBoxFuture<'_, Result<QueryResponse, EdgeError>> {
        self.reads.borrow_mut().push(q);
        Box::pin(async {
            Ok(QueryResponse {
                rows: Vec::new(),
                cache: ferry_shared::api::CacheStatus::Bypass,
                age_ms: 0,
                key: None,
                stale_reason: None,
                upstream_error: None,
                bypass_reason: None,
            })
        })
    }
    fn batch(
        &self,
        _: Vec<QueryRequest>,
    ) -> LocalBoxFuture<'_, Result<Vec<ferry_shared::api::BatchResult>, EdgeError>> {
        no()
    }
}

#[test]
fn reads_carry_the_latest_position_a_write_returned() {
    struct Writes;
    impl Calls for Writes {
        fn execute(
            &self,
            _: ExecuteRequest,
        ) -> LocalBoxFuture<'_, Result<ExecuteResponse, EdgeError>> {
            Box::pin(async {
                Ok(ExecuteResponse {
                    rows_affected: 1,
                    invalidation: ferry_shared::api::InvalidationStatus::None,
                    position: Some(Position(0x500)),
                })
            })
        }
        fn keyed(&self, _: KeyedRequest) -> LocalBoxFuture<'_, Result<KeyedResponse, EdgeError>> {
            no()
        }
        fn cache(&self, _: CacheCommand) -> LocalBoxFuture<'_, Result<CacheReply, EdgeError>> {
            no()
        }
        /// Its answer lost with its sidecar, its outcome committed at 0x700.
        fn transaction(
            &self,
            _: TransactionRequest,
        ) -> LocalBoxFuture<'_, Result<TransactionResponse, EdgeError>> {
            Box::pin(async {
                Err(EdgeError::CommittedWithoutResults {
                    rows_affected: 2,
                    invalidation: ferry_shared::api::InvalidationStatus::Done,
                    position: Some(Position(0x700)),
                })
            })
        }
        fn readiness(&self) -> LocalBoxFuture<'_, Result<Readiness, EdgeError>> {
            no()
        }
    }
    let reads = Rc::new(Positions::default());
    struct Shared(Rc<Positions>);
    impl Transport for Shared {
        fn query(&self, q: QueryRequest) -> LocalBoxFuture<'_, Result<QueryResponse, EdgeError>> {
            self.0.query(q)
        }
        fn batch(
            &self,
            q: Vec<QueryRequest>,
        ) -> LocalBoxFuture<'_, Result<Vec<ferry_shared::api::BatchResult>, EdgeError>> {
            self.0.batch(q)
        }
    }
    let f = Ferry::with_transport(Box::new(Shared(reads.clone())), Rc::new(Writes), false);
    futures::executor::block_on(async {
        f.sql("SELECT 1").response().await.expect("read");
        assert_eq!(f.position(), None);
        let built_before = f.sql("SELECT 2");
        f.execute("w").run().await.expect("write");
        assert_eq!(f.position(), Some(Position(0x500)));
        built_before.response().await.expect("read");
        // A clone (another part of the handler) shares it; an older position does not win.
        f.clone()
            .after(Some(Position(0x100)))
            .sql("SELECT 3")
            .response()
            .await
            .expect("read");
    });
    let afters: Vec<_> = reads.reads.borrow().iter().map(|q| q.after).collect();
    assert_eq!(afters, [None, Some(Position(0x500)), Some(Position(0x500))]);
    // A transaction that committed without its results still moves the position.
    futures::executor::block_on(f.transaction().statement("t", &[1]).run()).expect_err("lost");
    assert_eq!(f.position(), Some(Position(0x700)));
    let resumed = unused().after(Some(Position(0x900)));
    assert_eq!(resumed.position(), Some(Position(0x900)));
}

fn unused() -> Ferry {
    Ferry::offline()
}

#[test]
fn requests_carry_the_user_and_the_first_bad_parameter_stops_the_call() {
    let who = Identity {
        role: "authenticated".into(),
        claims: Default::default(),
    };
    let f = unused().as_user(who.clone());
    assert_eq!(f.query("q").request().identity.as_ref(), Some(&who));
    assert_eq!(f.execute("w").request().identity.as_ref(), Some(&who));
    let tx = f.transaction().statement("w", &[1, 2]).read_only();
    assert_eq!(tx.request().identity.as_ref(), Some(&who));
    assert_eq!(
        tx.request().statements[0].params,
        vec![serde_json::json!(1), serde_json::json!(2)]
    );
    assert!(unused().query("q").request().identity.is_none());
    // A map with non-string keys cannot be JSON: the call fails before it is sent.
    let bad: std::collections::HashMap<Vec<u8>, i32> = [(vec![1u8], 1)].into_iter().collect();
    let q = unused().query("q").bind(bad);
    let e = futures::executor::block_on(q.response()).expect_err("refused");
    assert_eq!(e.status(), 400);
}

//! Automatic batching: reads issued concurrently within one request (`join!`, `join_all`) go
//! to the sidecar as one `/v1/batch` call.
//!
//! The first read to arrive takes the lead: it yields once, so every other future its task
//! polls in the same round (the rest of the `join!`) can queue its read, then sends the whole
//! queue as one call and hands each read its own answer. A lone read goes as a plain
//! `/v1/query`. Nothing waits on a timer: the only delay is one turn of the executor.

use crate::error::EdgeError;
use ferry_shared::api::{BatchResult, QueryRequest, QueryResponse};
use futures_channel::oneshot;
use futures_util::future::LocalBoxFuture;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// Most reads sent in one `/v1/batch` call (the sidecar's `cache.max_batch` defaults to 1000).
pub const MAX_BATCH: usize = 100;

/// How reads reach the sidecar: the signed HTTP client on wasm32, a fake in tests.
pub trait Transport {
    /// One read (`/v1/query`).
    fn query(&self, read: QueryRequest) -> LocalBoxFuture<'_, Result<QueryResponse, EdgeError>>;
    /// Many reads in one call (`/v1/batch`), answered in order.
    fn batch(
        &self,
        reads: Vec<QueryRequest>,
    ) -> LocalBoxFuture<'_, Result<Vec<BatchResult>, EdgeError>>;
}

type Waiter = oneshot::Sender<Result<QueryResponse, EdgeError>>;

/// One request's queue of reads.
pub struct Batcher {
    transport: Box<dyn Transport>,
    queue: RefCell<Vec<(QueryRequest, Waiter)>>,
    /// Calls made to the sidecar so far (one per batch or lone read).
    calls: Cell<u32>,
    enabled: bool,
}

impl Batcher {
    /// A queue over `transport`; `enabled: false` sends each read on its own.
    pub fn new(transport: Box<dyn Transport>, enabled: bool) -> Self {
        Batcher {
            transport,
            queue: RefCell::new(Vec::new()),
            calls: Cell::new(0),
            enabled,
        }
    }

    /// Sidecar calls made so far by this request's reads.
    pub fn calls(&self) -> u32 {
        self.calls.get()
    }

    /// Runs one read, batched with the reads issued alongside it.
    pub async fn read(self: &Rc<Self>, read: QueryRequest) -> Result<QueryResponse, EdgeError> {
        if !self.enabled {
            self.calls.set(self.calls.get() + 1);
            return self.transport.query(read).await;
        }
        let (tx, rx) = oneshot::channel();
        let leads = {
            let mut q = self.queue.borrow_mut();
            q.push((read, tx));
            q.len() == 1
        };
        if leads {
            YieldOnce(false).await;
            self.flush().await;
        }
        rx.await
            .unwrap_or(Err(EdgeError::BadResponse { status: 0 }))
    }

    /// Sends everything queued, in calls of at most [`MAX_BATCH`] reads.
    async fn flush(&self) {
        loop {
            let chunk: Vec<(QueryRequest, Waiter)> = {
                let mut q = self.queue.borrow_mut();
                let n = q.len().min(MAX_BATCH);
                q.drain(..n).collect()
            };
            if chunk.is_empty() {
                return;
            }
            self.calls.set(self.calls.get() + 1);
            let (reads, waiters): (Vec<_>, Vec<_>) = chunk.into_iter().unzip();
            let n = reads.len();
            if n == 1 {
                for (read, w) in reads.into_iter().zip(waiters) {
                    let _ = w.send(self.transport.query(read).await);
                }
                continue;
            }
            match self.transport.batch(reads).await {
                Ok(results) if results.len() == n => {
                    for (w, r) in waiters.into_iter().zip(results) {
                        let _ = w.send(match r {
                            BatchResult::Ok(resp) => Ok(resp),
                            BatchResult::Error(detail) => Err(EdgeError::from_detail(detail)),
                        });
                    }
                }
                Ok(_) => {
                    for w in waiters {
                        let _ = w.send(Err(EdgeError::BadResponse { status: 200 }));
                    }
                }
                Err(e) => {
                    for w in waiters {
                        let _ = w.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}

/// Pending once (waking itself), so the rest of the task's futures are polled first.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_shared::api::CacheStatus;
    use serde_json::json;

    /// Answers each read with one row echoing its first parameter; counts calls.
    #[derive(Default)]
    struct Fake {
        log: Rc<RefCell<Vec<usize>>>,
    }

    fn answer(read: &QueryRequest) -> Result<QueryResponse, EdgeError> {
        if read.params.first() == Some(&json!("fail")) {
            return Err(EdgeError::bad_request("this one fails"));
        }
        Ok(QueryResponse {
            rows: vec![[("v".to_string(), read.params[0].clone())]
                .into_iter()
                .collect()],
            cache: CacheStatus::Miss,
            age_ms: 0,
            key: None,
            stale_reason: None,
            upstream_error: None,
            bypass_reason: None,
        })
    }

    impl Transport for Fake {
        fn query(
            &self,
            read: QueryRequest,
        ) -> LocalBoxFuture<'_, Result<QueryResponse, EdgeError>> {
            self.log.borrow_mut().push(1);
            Box::pin(async move { answer(&read) })
        }
        fn batch(
            &self,
            reads: Vec<QueryRequest>,
        ) -> LocalBoxFuture<'_, Result<Vec<BatchResult>, EdgeError>> {
            self.log.borrow_mut().push(reads.len());
            Box::pin(async move {
                Ok(reads
                    .iter()
                    .map(|r| match answer(r) {
                        Ok(a) => BatchResult::Ok(a),
                        Err(e) => BatchResult::Error(e.body().error),
                    })
                    .collect())
            })
        }
    }

    fn read(v: serde_json::Value) -> QueryRequest {
        QueryRequest {
            query: Some("q".into()),
            params: vec![v],
            ..Default::default()
        }
    }

    fn batcher(enabled: bool) -> (Rc<Batcher>, Rc<RefCell<Vec<usize>>>) {
        let fake = Fake::default();
        let log = fake.log.clone();
        (Rc::new(Batcher::new(Box::new(fake), enabled)), log)
    }

    #[test]
    fn concurrent_reads_go_as_one_call_each_with_its_answer() {
        let (b, log) = batcher(true);
        let answers = futures::executor::block_on(futures::future::join_all(
            (0..10).map(|i| b.read(read(json!(i)))),
        ));
        assert_eq!(*log.borrow(), vec![10], "one batch of 10");
        assert_eq!(b.calls(), 1);
        for (i, a) in answers.into_iter().enumerate() {
            assert_eq!(a.expect("ok").rows[0]["v"], json!(i));
        }
    }

    #[test]
    fn a_failing_read_fails_alone_and_big_batches_are_split() {
        let (b, log) = batcher(true);
        let (ok, bad) = futures::executor::block_on(async {
            futures::join!(b.read(read(json!(1))), b.read(read(json!("fail"))))
        });
        assert!(ok.is_ok());
        assert_eq!(bad.expect_err("fails").status(), 400);
        let n = MAX_BATCH + 5;
        let all = futures::executor::block_on(futures::future::join_all(
            (0..n).map(|i| b.read(read(json!(i)))),
        ));
        assert!(all.iter().all(Result::is_ok));
        assert_eq!(*log.borrow(), vec![2, MAX_BATCH, 5]);
    }

    #[test]
    fn sequential_reads_and_the_opt_out_go_one_by_one() {
        let (b, log) = batcher(true);
        futures::executor::block_on(async {
            b.read(read(json!(1))).await.expect("ok");
            b.read(read(json!(2))).await.expect("ok");
        });
        assert_eq!(*log.borrow(), vec![1, 1]);
        let (off, log) = batcher(false);
        futures::executor::block_on(futures::future::join_all(
            (0..3).map(|i| off.read(read(json!(i)))),
        ));
        assert_eq!(*log.borrow(), vec![1, 1, 1]);
    }
}

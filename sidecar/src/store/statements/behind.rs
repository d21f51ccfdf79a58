//! A session's reset sent right behind a statement, so both go out in one write and the reset
//! costs no round trip of its own (`on_loop` reads, `/sql`'s single reads in `text`): Postgres
//! runs it once the statement is done, and its answer is read after the statement's.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// The session's reset, as a future of the driver.
pub(super) type ResetFuture<'a> =
    Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + 'a>>;

/// The reset, sent right behind a statement: finished when its answer came with the first
/// poll (the connection had already failed), else still to be awaited.
pub(super) enum Sent<'a> {
    Done(Result<(), tokio_postgres::Error>),
    Pending(ResetFuture<'a>),
}

impl Sent<'_> {
    pub(super) async fn finish(self) -> Result<(), tokio_postgres::Error> {
        match self {
            Sent::Done(r) => r,
            Sent::Pending(f) => f.await,
        }
    }
}

/// Runs `first` to its end with `reset` started right behind it: polled once as soon as
/// `first` is waiting (it has sent its request), so both requests go out in one write. A
/// `first` done at its first poll (it sent nothing, or failed at once) gets the reset after
/// it, never ahead of it.
pub(super) async fn sent_behind<'a, A: Future>(
    first: A,
    reset: ResetFuture<'a>,
) -> (A::Output, Sent<'a>) {
    let mut first = std::pin::pin!(first);
    let mut sent: Option<Sent<'a>> = None;
    let mut reset = Some(reset);
    let out = std::future::poll_fn(|cx| {
        let out = first.as_mut().poll(cx);
        if out.is_pending() {
            if let Some(mut f) = reset.take() {
                sent = Some(match f.as_mut().poll(cx) {
                    Poll::Ready(r) => Sent::Done(r),
                    Poll::Pending => Sent::Pending(f),
                });
            }
        }
        out
    })
    .await;
    let sent = match (sent, reset) {
        (Some(s), _) => s,
        // `first` was done at its first poll, before the reset was sent: send it now.
        (None, Some(f)) => Sent::Pending(f),
        (None, None) => Sent::Done(Ok(())),
    };
    (out, sent)
}

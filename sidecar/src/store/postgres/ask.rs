//! One conversation, two kinds of session. What Ferry asks Postgres about a statement (what it
//! reads and calls, `analysis`; whether it reads by values, `by_value`) is written once, as
//! async code over [`Ask`]: on a worker's own session it runs on the event loop; on a blocking
//! one (`--check-config`, `--explain-cache`, startup and the blocking pool) every step answers
//! at once, and [`blocking`] drives the conversation to its end.

use futures_util::FutureExt;
use postgres::types::ToSql;
use tokio_postgres::{Error, Row, SimpleQueryMessage, Statement};

/// The steps a conversation takes with a session.
pub(crate) trait Ask {
    async fn prepare(&mut self, sql: &str) -> Result<Statement, Error>;
    async fn batch(&mut self, sql: &str) -> Result<(), Error>;
    async fn execute(&mut self, sql: &str) -> Result<u64, Error>;
    async fn query(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)])
        -> Result<Vec<Row>, Error>;
    async fn simple(&mut self, sql: &str) -> Result<Vec<SimpleQueryMessage>, Error>;
}

impl Ask for &tokio_postgres::Client {
    async fn prepare(&mut self, sql: &str) -> Result<Statement, Error> {
        tokio_postgres::Client::prepare(self, sql).await
    }
    async fn batch(&mut self, sql: &str) -> Result<(), Error> {
        self.batch_execute(sql).await
    }
    async fn execute(&mut self, sql: &str) -> Result<u64, Error> {
        tokio_postgres::Client::execute(self, sql, &[]).await
    }
    async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        tokio_postgres::Client::query(self, sql, params).await
    }
    async fn simple(&mut self, sql: &str) -> Result<Vec<SimpleQueryMessage>, Error> {
        self.simple_query(sql).await
    }
}

impl Ask for &mut postgres::Client {
    async fn prepare(&mut self, sql: &str) -> Result<Statement, Error> {
        postgres::Client::prepare(self, sql)
    }
    async fn batch(&mut self, sql: &str) -> Result<(), Error> {
        self.batch_execute(sql)
    }
    async fn execute(&mut self, sql: &str) -> Result<u64, Error> {
        postgres::Client::execute(self, sql, &[])
    }
    async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        postgres::Client::query(self, sql, params)
    }
    async fn simple(&mut self, sql: &str) -> Result<Vec<SimpleQueryMessage>, Error> {
        self.simple_query(sql)
    }
}

/// The answer of a conversation held with a blocking session: every step of it is ready when
/// first asked (the blocking client waits inside it), so the whole is too. None only if a step
/// were to wait on an event loop, which no blocking step does.
pub(crate) fn blocking<T>(conversation: impl std::future::Future<Output = T>) -> Option<T> {
    conversation.now_or_never()
}

//! The stream's own session (`setup::connect`), its repeated statements prepared once.
//!
//! The consumer asks the catalog the same questions every heartbeat (the watched tables'
//! definitions, what the publication covers, the slot's lag) before each mark, and a follower
//! asks whether the slot is free twice as often. Sent as text, each was parsed and planned again
//! every time: an idle sidecar cost Postgres about 30 ms of CPU a second (3 ms a heartbeat,
//! measured from /proc; the catalog views behind the publication question are the dearest to
//! plan). Prepared once per session and planned generically, a heartbeat costs less than half
//! that, 1.3 ms (`bench/results/experiments/2026-12-05-stream-session.md`).

use std::collections::HashMap;
use std::sync::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, Row, Statement};

pub(super) struct Session {
    client: Client,
    /// Statements prepared on this connection, by their text.
    prepared: Mutex<HashMap<&'static str, Statement>>,
}

impl Session {
    pub(super) fn new(client: Client) -> Session {
        Session {
            client,
            prepared: Mutex::default(),
        }
    }

    /// The connection itself, for one-off statements.
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    /// `sql`, prepared on its first use on this session.
    async fn statement(&self, sql: &'static str) -> Result<Statement, Error> {
        let known = self
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sql)
            .cloned();
        if let Some(s) = known {
            return Ok(s);
        }
        let s = self.client.prepare(sql).await?;
        self.prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sql, s.clone());
        Ok(s)
    }

    pub(super) async fn query(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let s = self.statement(sql).await?;
        self.client.query(&s, params).await
    }

    pub(super) async fn query_one(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        let s = self.statement(sql).await?;
        self.client.query_one(&s, params).await
    }

    pub(super) async fn query_opt(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        let s = self.statement(sql).await?;
        self.client.query_opt(&s, params).await
    }
}

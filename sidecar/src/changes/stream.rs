//! The consumer's loop: take the slot (or follow while another sidecar streams from it), then
//! read it, turn changes into invalidations, apply them to Redis, and only then confirm the
//! position to Postgres.
//!
//! Confirmation follows Redis: a crash (or Redis down) before an invalidation is applied leaves
//! the slot's position before it, so the next consumer replays it. Applying twice is harmless
//! (an invalidation only moves versions), so a sidecar that lost the race for the slot cannot
//! do harm either: the slot admits one reader at a time, and only that reader confirms.

use super::deps::{Invalidations, Watched};
use super::pgoutput::{Decoder, Event};
use super::session::Session;
use super::setup;
use super::Status;
use crate::config::Config;
use crate::store::cache::{now_ms, Cache};
use crate::store::pools::Pools;
use futures_util::FutureExt;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Changes gathered before they are applied even if more are ready (bounds memory and the
/// size of one round of Redis work).
const MAX_GATHER: usize = 50_000;
/// Postgres timestamps count microseconds from 2000-01-01.
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;

pub(super) struct Ctx {
    pub config: Arc<Config>,
    pub cache: Weak<Cache>,
    pub pools: Weak<Pools>,
    pub status: Arc<Status>,
    pub watched: Watched,
}

impl Ctx {
    fn stores(&self) -> Result<(Arc<Cache>, Arc<Pools>), String> {
        match (self.cache.upgrade(), self.pools.upgrade()) {
            (Some(c), Some(p)) => Ok((c, p)),
            _ => Err("the sidecar is stopping".into()),
        }
    }

    /// Runs blocking Redis work off the stream's thread.
    async fn redis<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Cache, &Pools) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let (cache, pools) = self.stores()?;
        tokio::task::spawn_blocking(move || f(&cache, &pools))
            .await
            .map_err(|e| e.to_string())?
    }

    fn tables(&self) -> Vec<String> {
        self.watched.tables().cloned().collect()
    }
}

/// Sessions one after the other until the sidecar stops.
pub(super) async fn run(ctx: Ctx) {
    loop {
        let ended = session(&ctx).await;
        ctx.status.set_role(super::Role::Starting);
        if ctx.stores().is_err() {
            return;
        }
        if let Err(e) = ended {
            tracing::warn!(error = %e, "change stream: session ended, starting again");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn session(ctx: &Ctx) -> Result<(), String> {
    let c = &ctx.config.changes;
    let client = Session::new(
        setup::connect(&ctx.config)
            .await
            .map_err(|e| e.to_string())?,
    );
    follow(ctx, &client).await?;
    let tables = ctx.tables();
    let fresh_slot = match setup::prepare(client.client(), c, &tables).await {
        Ok(fresh) => fresh,
        // Another sidecar made the slot at the same moment: it leads.
        Err(e) if setup::slot_taken(&e.to_string()) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let mut consumer = Consumer {
        ctx,
        // Entries named by a value made before this consumer began were kept fresh by another,
        // perhaps one that moved no value keys: they go before its first mark.
        pending: Invalidations {
            everything: fresh_slot,
            tags: [crate::store::cache::VALUES_EPOCH_TAG.to_string()].into(),
            ..Default::default()
        },
        commits_ms: Vec::new(),
        definitions: BTreeMap::new(),
        client: &client,
        xids: Vec::new(),
    };
    // DDL made while no sidecar consumed: compare with what the last consumer saw.
    let stored = ctx
        .redis(|cache, pools| cache.stored_definitions(pools))
        .await?;
    consumer.definitions = stored;
    consumer.check_definitions(&client).await?;
    consumer.flush(None).await?;

    let repl = match ReplicationClient::connect(replication_config(&ctx.config)?).await {
        Ok(repl) => repl,
        // Another sidecar streams from the slot: it leads, this one follows (next session).
        Err(e) if setup::slot_taken(&e.to_string()) => return Ok(()),
        Err(e) => return Err(format!("replication connection: {e}")),
    };
    ctx.status.set_role(super::Role::Leader);
    tracing::info!(slot = %c.slot, "change stream: this sidecar consumes the slot");
    // Tables the publication stopped covering: their changes no longer reach the stream.
    let mut uncovered: Vec<String> = Vec::new();
    let mut decoder = Decoder::default();
    let mut tick = tokio::time::interval(Duration::from_millis(c.heartbeat_ms.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut repl = repl;
    loop {
        tokio::select! {
            first = repl.recv() => {
                let mut next = first.map_err(|e| format!("replication stream: {e}"))?;
                let mut in_txn = false;
                let mut confirm: Option<Lsn> = None;
                // The latest mark: its time, and its commit's end once that arrives.
                let mut mark: Option<(u64, Option<u64>)> = None;
                // Everything already received is gathered, then applied in one round.
                while let Some(ev) = next {
                    match ev {
                        ReplicationEvent::Begin { xid, .. } => {
                            in_txn = true;
                            consumer.xids.push(xid);
                        }
                        ReplicationEvent::XLogData { data, .. } => {
                            let event = decoder.decode(&data).map_err(|e| e.to_string())?;
                            if matches!(event, Event::Row { .. }) {
                                ctx.status.count_change();
                            }
                            ctx.watched.note(&event, &mut consumer.pending);
                        }
                        ReplicationEvent::Commit { end_lsn, commit_time_micros, .. } => {
                            in_txn = false;
                            confirm = Some(end_lsn);
                            if let Some((_, at @ None)) = &mut mark {
                                *at = Some(end_lsn.as_u64());
                            }
                            consumer
                                .commits_ms
                                .push(commit_time_micros / 1000 + PG_EPOCH_UNIX_MS);
                        }
                        ReplicationEvent::Message { prefix, .. } if prefix == setup::FLUSH_PREFIX => {
                            consumer.pending.everything = true;
                        }
                        ReplicationEvent::Message { prefix, content, .. } if prefix == "ferry.mark" => {
                            let ms = std::str::from_utf8(&content).ok().and_then(|s| s.parse().ok());
                            mark = ms.map(|ms| (ms, None));
                        }
                        // Everything before the server's position has been received: with no
                        // transaction open, that position is safe to confirm once applied.
                        ReplicationEvent::KeepAlive { wal_end, .. } if !in_txn => {
                            confirm = Some(confirm.map_or(wal_end, |c| c.max(wal_end)));
                        }
                        ReplicationEvent::StoppedAt { .. } => return Err("the stream stopped".into()),
                        _ => {}
                    }
                    if !in_txn && consumer.pending.len() >= MAX_GATHER {
                        break;
                    }
                    next = match repl.recv().now_or_never() {
                        Some(r) => r.map_err(|e| format!("replication stream: {e}"))?,
                        None if in_txn => repl.recv().await.map_err(|e| format!("replication stream: {e}"))?,
                        None => None,
                    };
                }
                // A mark counts once its commit is in: every commit before it is then here.
                consumer.flush(mark.and_then(|(ms, at)| Some((ms, at?)))).await?;
                if let Some(lsn) = confirm {
                    repl.update_applied_lsn(lsn);
                }
            }
            _ = tick.tick() => {
                let mark_ms = now_ms();
                consumer.check_definitions(&client).await?;
                let now_uncovered = setup::uncovered(&client, c, &ctx.tables())
                    .await
                    .map_err(|e| e.to_string())?;
                if now_uncovered != uncovered {
                    if now_uncovered.is_empty() {
                        // Covered again: what changed meanwhile never reached the stream.
                        for t in ctx.tables() {
                            ctx.watched.whole_table(&t, &mut consumer.pending);
                        }
                        tracing::info!("change stream: the publication covers the watched tables again");
                    } else {
                        tracing::error!(
                            publication = %c.publication, missing = ?now_uncovered,
                            "change stream: the publication no longer covers what the cache \
                             depends on; cached reads bypass until it does"
                        );
                    }
                    uncovered = now_uncovered;
                }
                if !consumer.pending.is_empty() {
                    consumer.flush(None).await?;
                }
                match setup::slot_lag_bytes(&client, c).await {
                    Ok(lag) => ctx.status.set_slot_lag(lag),
                    Err(e) => return Err(e.to_string()),
                }
                // No mark while changes may be missed: the watermark ages past
                // changes.max_lag_ms, and every sidecar's cached reads bypass.
                if uncovered.is_empty() {
                    setup::mark(&client, mark_ms).await.map_err(|e| e.to_string())?;
                }
                ctx.stores()?;
            }
        }
    }
}

/// Follows while another sidecar streams from the slot (keeping this one's view of the
/// watermark fresh); returns once the slot is free.
async fn follow(ctx: &Ctx, client: &Session) -> Result<(), String> {
    let every = Duration::from_millis((ctx.config.changes.heartbeat_ms / 2).max(1));
    while !setup::slot_free(client, &ctx.config.changes)
        .await
        .map_err(|e| e.to_string())?
    {
        ctx.status.set_role(super::Role::Follower);
        if let Err(e) = ctx
            .redis(|cache, pools| cache.refresh_watermark(pools))
            .await
        {
            tracing::debug!(error = %e, "change stream: the watermark is not readable");
        }
        tokio::time::sleep(every).await;
        ctx.stores()?;
    }
    Ok(())
}

struct Consumer<'a> {
    ctx: &'a Ctx,
    pending: Invalidations,
    /// Commit times (unix ms) of the transactions in `pending`, for the lag histogram.
    commits_ms: Vec<i64>,
    /// The watched tables' definitions as last seen (digest; absent for a dropped table).
    definitions: BTreeMap<String, String>,
    /// The stream's own session (not the replication connection).
    client: &'a Session,
    /// The transactions received since the last flush, applied once sessions see them.
    xids: Vec<u32>,
}

impl Consumer<'_> {
    /// Adds a whole-table invalidation for each watched table whose definition changed.
    async fn check_definitions(&mut self, client: &Session) -> Result<(), String> {
        let now = setup::definitions(client, &self.ctx.tables())
            .await
            .map_err(|e| e.to_string())?;
        let mut changed = false;
        for (table, digest) in now {
            let digest = digest.unwrap_or_default();
            if self.definitions.get(&table) != Some(&digest) {
                if self.definitions.contains_key(&table) || !digest.is_empty() {
                    self.ctx.watched.whole_table(&table, &mut self.pending);
                }
                self.definitions.insert(table, digest);
                changed = true;
            }
        }
        if changed {
            self.flush(None).await?;
            let defs = self.definitions.clone();
            // Not fatal: a consumer that finds older ones invalidates the tables again.
            if let Err(e) = self
                .ctx
                .redis(move |cache, pools| cache.store_definitions(pools, &defs))
                .await
            {
                tracing::debug!(error = %e, "change stream: the definitions were not stored");
            }
        }
        Ok(())
    }

    /// Applies what is pending, retrying until Redis takes it (the stream waits meanwhile, and
    /// nothing is confirmed), then publishes `mark` (its time, and its commit's end in the
    /// WAL) as the watermark.
    async fn flush(&mut self, mark: Option<(u64, u64)>) -> Result<(), String> {
        if !self.pending.is_empty() {
            super::visible::wait(self.client, &self.xids).await?;
            let keys: Vec<String> = self.pending.keys.iter().cloned().collect();
            let tags: Vec<String> = self.pending.tags.iter().cloned().collect();
            let everything = self.pending.everything;
            loop {
                let (k, t) = (keys.clone(), tags.clone());
                let applied = self
                    .ctx
                    .redis(move |cache, pools| cache.invalidate_changes(pools, &k, &t, everything))
                    .await;
                match applied {
                    Ok(()) => break,
                    Err(e) => {
                        self.ctx.stores()?;
                        self.ctx.status.count_apply_failure();
                        tracing::debug!(error = %e, "change stream: redis did not take the invalidations; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            self.ctx.status.count_applied(keys.len() + tags.len());
            self.pending = Invalidations::default();
        }
        self.xids.clear();
        let now = now_ms() as i64;
        self.ctx
            .status
            .observe_lag(self.commits_ms.drain(..).map(|c| (now - c).max(0) as u64));
        if let Some(m) = mark {
            // Not fatal: the next mark publishes a later one (meanwhile reads bypass).
            if let Err(e) = self
                .ctx
                .redis(move |cache, pools| cache.publish_watermark(pools, m.0, m.1))
                .await
            {
                tracing::debug!(error = %e, "change stream: the watermark was not published");
            }
        }
        Ok(())
    }
}

/// The replication connection's settings, from `postgres.url` (its host, user, password,
/// database and TLS mode).
fn replication_config(config: &Config) -> Result<pgwire_replication::ReplicationConfig, String> {
    use pgwire_replication::{ReplicationConfig, TlsConfig};
    use tokio_postgres::config::{Host, SslMode};
    let pg = crate::store::postgres::pg_async_config(config).map_err(|e| e.to_string())?;
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let user = pg.get_user().unwrap_or("postgres").to_string();
    let password = pg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let db = pg.get_dbname().unwrap_or(&user).to_string();
    let tls = match pg.get_ssl_mode() {
        SslMode::Disable => TlsConfig::disabled(),
        SslMode::Prefer if crate::store::postgres::is_loopback_host(&host) => TlsConfig::disabled(),
        _ => {
            let ca = (!config.postgres.tls_ca_path.is_empty())
                .then(|| config.postgres.tls_ca_path.clone().into());
            TlsConfig::verify_full(ca).with_sni_hostname(host.clone())
        }
    };
    let c = &config.changes;
    Ok(ReplicationConfig::new(
        host,
        user,
        password,
        db,
        c.slot.clone(),
        c.publication.clone(),
    )
    .with_port(pg.get_ports().first().copied().unwrap_or(5432))
    .with_tls(tls)
    .with_application_name("ferry-changes-stream")
    .with_status_interval(Duration::from_secs(1)))
}

//! `GET /healthz` (the process answers) and `GET /readyz` (both pools can serve). Unsigned:
//! load balancers call them, and they reveal nothing but up/down.

use super::State;
use actix_web::HttpResponse;
use ferry_shared::api::{ChangesReadiness, DependencyState, Readiness};

pub(crate) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// From the background probe's snapshot (see `readiness.rs`): no pool work per request.
pub(crate) async fn readyz(state: State) -> HttpResponse {
    let snap = state.readiness.snapshot().unwrap_or_default();
    let (redis, postgres) = (snap.redis, snap.postgres);
    let pending = state.cache.pending_count();
    let up = |ok: bool| {
        if ok {
            DependencyState::Up
        } else {
            DependencyState::Down
        }
    };
    let body = Readiness {
        ready: redis && postgres,
        redis: up(redis),
        postgres: up(postgres),
        pending_invalidations: pending as u64,
        cache_bypassed: pending > 0 || !state.cache.freshness().serves(),
        changes: changes(&state),
    };
    if body.ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable()
            .insert_header((actix_web::http::header::RETRY_AFTER, "1"))
            .json(body)
    }
}

fn changes(state: &State) -> Option<ChangesReadiness> {
    let role = state.changes.role();
    if role == crate::changes::Role::Off {
        return None;
    }
    let (stream, lag_ms) = state.cache.freshness().state();
    Some(ChangesReadiness {
        state: stream.as_str().into(),
        role: role.as_str().into(),
        lag_ms,
    })
}

/// `GET /metrics` on the admin listener.
pub(crate) async fn metrics(state: State) -> HttpResponse {
    let r = state.pools.redis.state();
    let (pg_open, pg_idle) = state.pools.pg_state();
    let (redis_max, pg_max) = state.pools.sizes();
    let mut text = crate::metrics::global().render(&[
        ("redis", redis_max, r.connections, r.idle_connections),
        ("postgres", pg_max, pg_open, pg_idle),
    ]);
    let pending = state.cache.pending_count();
    text.push_str(&format!(
        "# HELP ferry_pending_invalidations Invalidations waiting for Redis (the whole cache counts as one).\n\
         # TYPE ferry_pending_invalidations gauge\nferry_pending_invalidations {pending}\n\
         # HELP ferry_cache_bypassed 1 while reads bypass Redis because invalidations are pending.\n\
         # TYPE ferry_cache_bypassed gauge\nferry_cache_bypassed {}\n",
        u8::from(pending > 0)
    ));
    let settings = state.readiness.role_settings().len();
    text.push_str(&format!(
        "# HELP ferry_postgres_role_settings Settings the login role or the database carry (ALTER ROLE/DATABASE ... SET); the log names them.\n\
         # TYPE ferry_postgres_role_settings gauge\nferry_postgres_role_settings {settings}\n"
    ));
    state.changes.render(&state.cache, &mut text);
    state.replicas.render(&mut text);
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(text)
}

//! `GET /healthz` (the process answers) and `GET /readyz` (both pools can serve). Unsigned:
//! load balancers call them, and they reveal nothing but up/down.

use super::State;
use crate::db;
use actix_web::HttpResponse;
use ferry_shared::api::{DependencyState, Readiness};

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

pub async fn readyz(state: State) -> HttpResponse {
    let s = state.clone();
    let probe = state
        .blocking
        .run(move || {
            let redis = s
                .pools
                .redis_conn()
                .and_then(|mut c| {
                    redis::cmd("PING").query::<String>(&mut *c).map_err(|e| {
                        crate::error::ApiError::CacheUnavailable {
                            internal: e.to_string(),
                        }
                    })
                })
                .is_ok();
            let postgres = db::ping(&s.pools).is_ok();
            Ok((redis, postgres))
        })
        .await;
    let (redis, postgres) = probe.unwrap_or((false, false));
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
    };
    if body.ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable()
            .insert_header((actix_web::http::header::RETRY_AFTER, "1"))
            .json(body)
    }
}

/// `GET /metrics` on the admin listener.
pub async fn metrics(state: State) -> HttpResponse {
    let r = state.pools.redis.state();
    let (pg_open, pg_idle) = state.pools.pg_state();
    let (redis_max, pg_max) = state.pools.sizes();
    let text = crate::metrics::global().render(&[
        ("redis", redis_max, r.connections, r.idle_connections),
        ("postgres", pg_max, pg_open, pg_idle),
    ]);
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(text)
}

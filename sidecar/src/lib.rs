//! Ferry's sidecar: an actix-web service that owns bounded r2d2 pools to Redis and Postgres and
//! serves signed reads (read-through cached), writes (with invalidation) and cache commands,
//! and the Neon- and Upstash-compatible doors.
//!
//! Its public surface is what the binary and the tests need: [`config`] (the configuration,
//! its loading and validation), [`startup`] (the checks before serving), [`run`] and [`admin`]
//! (the listeners; tests call [`run`] with a listener on port 0, so they exercise the real
//! app), [`AppState`], and [`metrics`]. Everything else is the crate's own:
//!
//! The modules, and the way imports run (routes → read → store; http at the side):
//! - `routes`: one file per endpoint, each parse → plan → run → respond.
//! - `read`: plans, the read-through engine, single-flight, many reads and keyed reads.
//! - `changes`: change-stream invalidation (logical decoding), between state and read.
//! - `upstash`: Upstash's Redis REST protocol: the command policy and reply shapes.
//! - `neon`: Neon's SQL-over-HTTP protocol: requests to plans, statements run with text
//!   results.
//! - `store`: one folder per store or concept: Postgres connections, pools, statements, Redis
//!   clients, the cache, coordination across sidecars (nonces, leases, rate limits), replicas.
//! - `error`: every failure in the engine's words, with its stable code (no HTTP).
//! - `http`: authentication and the replay store, JSON bodies, request ids, the access
//!   middleware, errors → HTTP (the one place).
//! - [`metrics`]: the process's counters and histograms (Prometheus text); `tls`: rustls for
//!   the listener and the clients. Leaves: every layer may count and connect.
//! - `state`: `AppState`, everything a handler needs, built once.

// A panic is an outage here (a dead request, or on the edge a dead isolate).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// Crate-private modules' items are `pub(crate)`: what is `pub` is the library's surface.
#![warn(unreachable_pub)]

pub(crate) mod background;
pub(crate) mod changes;
pub mod config;
pub(crate) mod error;
pub(crate) mod http;
pub mod metrics;
pub(crate) mod neon;
pub(crate) mod read;
pub(crate) mod routes;
pub mod startup;
pub(crate) mod state;
pub(crate) mod store;
pub(crate) mod tls;
pub(crate) mod upstash;
pub(crate) mod write;

pub use config::Config;
use routes::configure;
pub use state::AppState;

use actix_web::{dev::Server, middleware, web, App, HttpServer};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

/// Starts the HTTP server on `listener` (the caller binds it, so tests can use port 0).
/// The returned server runs when awaited; it stops gracefully on SIGTERM/SIGINT, letting
/// in-flight requests finish for up to `server.shutdown_timeout_s`.
pub fn run(listener: TcpListener, state: Arc<AppState>) -> std::io::Result<Server> {
    let server_cfg = state.config().server.clone();
    let data = web::Data::from(state);
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            // Inside the request-id span, so metrics' access lines carry the id too.
            .wrap(middleware::from_fn(http::access::middleware))
            .wrap(middleware::from_fn(http::request_id::middleware))
            .configure(configure)
    })
    .shutdown_timeout(server_cfg.shutdown_timeout_s)
    // An answer streamed in pieces (a large mget) ends with a small write: with Nagle's
    // algorithm on, it waited for the client's delayed ACK (40 ms a 50 KB GET).
    .tcp_nodelay(true)
    // Headers must arrive within this many ms (slowloris); bodies are bounded in auth.rs.
    .client_request_timeout(Duration::from_millis(5_000));
    server = if server_cfg.tls_cert_path.is_empty() {
        server.listen(listener)?
    } else {
        let tls = tls::server_config(&server_cfg.tls_cert_path, &server_cfg.tls_key_path)
            .map_err(std::io::Error::other)?;
        server.listen_rustls_0_23(listener, tls)?
    };
    if server_cfg.workers > 0 {
        server = server.workers(server_cfg.workers);
    }
    Ok(server.run())
}

/// The admin server: `GET /metrics` (Prometheus text) and `GET /healthz`, meant for a listener
/// bound to localhost (`server.admin_listen`).
pub fn admin(listener: TcpListener, state: Arc<AppState>) -> std::io::Result<Server> {
    let data = web::Data::from(state);
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/metrics", web::get().to(routes::health::metrics))
            .route("/healthz", web::get().to(routes::health::healthz))
    })
    .workers(1)
    // On a signal actix stops the whole System once a server has stopped; the admin server
    // would stop first and cut the main server's drain short. It is stopped by the caller.
    .disable_signals()
    .listen(listener)?
    .run())
}

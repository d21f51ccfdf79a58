//! `ferry-sidecar`: args -> config -> pools -> serve.

// A panic is an outage here (a dead request, or on the edge a dead isolate).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use clap::Parser;
use ferry_sidecar::{AppState, Config};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;

/// Ferry's sidecar: pooled, signed, read-through access to Redis and Postgres.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML config file (deploy/ferry.toml is the commented sample). Without one, defaults and
    /// FERRY_* environment variables are used.
    #[arg(long, env = "FERRY_CONFIG")]
    config: Option<PathBuf>,

    /// Validate the configuration, print what is wrong (naming the key) or "config ok", and exit.
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let config = match Config::load(args.config.as_deref(), &env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferry-sidecar: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        println!("config ok");
        return ExitCode::SUCCESS;
    }
    init_tracing(&config.server.log_format);
    match serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sidecar stopped");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Logs go to stderr (journald and docker collect it); stdout stays free.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[actix_web::main]
async fn serve(config: Config) -> std::io::Result<()> {
    let listen = config.server.listen.clone();
    let (redis_size, pg_size) = (config.redis.pool_size, config.postgres.pool_size);
    let state = AppState::new(config).map_err(std::io::Error::other)?;
    let listener = TcpListener::bind(&listen)?;
    tracing::info!(
        listen = %listener.local_addr()?,
        redis_pool = redis_size,
        postgres_pool = pg_size,
        "ferry-sidecar listening"
    );
    let main = ferry_sidecar::run(listener, state.clone())?;
    let admin_listen = state.config.server.admin_listen.clone();
    if admin_listen.is_empty() {
        return main.await;
    }
    let admin = TcpListener::bind(&admin_listen)?;
    tracing::info!(admin = %admin.local_addr()?, "metrics on GET /metrics");
    let admin = ferry_sidecar::admin(admin, state)?;
    let admin_handle = admin.handle();
    // The admin server stops with the main one (both handle SIGTERM themselves).
    let admin_task = actix_web::rt::spawn(admin);
    let result = main.await;
    admin_handle.stop(true).await;
    let _ = admin_task.await;
    result
}

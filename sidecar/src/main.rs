//! `ferry-sidecar`: args -> config -> pools -> serve.

// A panic is an outage here (a dead request, or on the edge a dead isolate).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use actix_web::rt::signal::unix::{signal, SignalKind};
use clap::Parser;
use ferry_sidecar::{AppState, Config};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use tracing_subscriber::{prelude::*, reload, EnvFilter};

/// mimalloc instead of glibc's malloc: each request allocates and frees many small buffers
/// across two worker threads, and glibc's malloc and free took about 15% of the sidecar's
/// CPU under load (perf, Upstash GET). The figures: bench/results/experiments/2026-11-30-mimalloc.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

    /// Print what Ferry would do with this read (what Postgres says it reads and calls,
    /// whether it can be cached and stay fresh, on which tables), and exit.
    #[arg(long, value_name = "SQL")]
    explain_cache: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    ferry_sidecar::startup::install_crypto_provider();
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let loaded = Config::load(args.config.as_deref(), &env)
        .and_then(|c| ferry_sidecar::startup::check_config(&c).map(|()| c));
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferry-sidecar: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(sql) = &args.explain_cache {
        return match ferry_sidecar::startup::explain_cache(&config, sql) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ferry-sidecar: {e}");
                ExitCode::from(2)
            }
        };
    }
    // With [changes] on, a server or role that cannot stream stops the sidecar here, naming
    // what is missing; an unreachable Postgres does not (reads bypass until the stream runs).
    match ferry_sidecar::startup::check_change_stream(&config) {
        Ok(()) => {}
        Err(ferry_sidecar::startup::SetupError::Connect(e)) => {
            eprintln!(
                "ferry-sidecar: warning: the change stream's prerequisites were not checked: {e}"
            );
        }
        Err(e) => {
            eprintln!("ferry-sidecar: {e}");
            return ExitCode::from(2);
        }
    }
    if args.check_config {
        let sessions = match ferry_sidecar::startup::check_sessions(&config) {
            Ok(unchecked) => unchecked,
            Err(e) => {
                eprintln!("ferry-sidecar: {e}");
                return ExitCode::from(2);
            }
        };
        println!("config ok");
        if let Some(e) = sessions {
            println!("warning: the Postgres sessions were not checked: {e}");
        }
        match ferry_sidecar::startup::role_warnings(&config) {
            Ok(warnings) => warnings.iter().for_each(|w| println!("warning: {w}")),
            Err(e) => println!("warning: the database role was not checked: {e}"),
        }
        match ferry_sidecar::startup::named_reads(&config) {
            Ok(lines) => lines.iter().for_each(|(warn, line)| match warn {
                true => println!("warning: {line}"),
                false => println!("{line}"),
            }),
            Err(e) => println!("warning: the named reads were not analysed: {e}"),
        }
        return ExitCode::SUCCESS;
    }
    let log = init_tracing(&config.server.log_format, &config.server.log_level);
    {
        // Said once at startup, off the serving path (Postgres may not be up yet).
        let config = config.clone();
        let _ = std::thread::Builder::new()
            .name("ferry-role-check".into())
            .spawn(move || {
                if let Ok(warnings) = ferry_sidecar::startup::role_warnings(&config) {
                    warnings.iter().for_each(|w| tracing::warn!("{w}"));
                }
                // The plain ones are logged as the sidecar finds them; here the warnings.
                if let Ok(lines) = ferry_sidecar::startup::named_reads(&config) {
                    lines
                        .iter()
                        .filter(|l| l.0)
                        .for_each(|l| tracing::warn!("{}", l.1));
                }
            });
    }
    match serve(config, args.config, log) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sidecar stopped");
            ExitCode::FAILURE
        }
    }
}

/// The log filter can be swapped on SIGHUP (unless FERRY_LOG pins it).
type LogHandle = Option<reload::Handle<EnvFilter, tracing_subscriber::Registry>>;

fn init_tracing(format: &str, level: &str) -> LogHandle {
    let pinned = std::env::var("FERRY_LOG").is_ok();
    let filter = EnvFilter::try_from_env("FERRY_LOG")
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    // Logs go to stderr (journald and docker collect it); stdout stays free.
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    if format == "json" {
        registry.with(layer.json()).init();
    } else {
        registry.with(layer).init();
    }
    (!pinned).then_some(handle)
}

/// SIGHUP: re-reads the config file and environment, applies what can change safely, and says
/// what needs a restart. A config that does not load is refused whole (the old one stays).
fn reload(state: &AppState, path: Option<&std::path::Path>, log: &LogHandle) {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    match Config::load(path, &env)
        .and_then(|c| ferry_sidecar::startup::check_config(&c).map(|()| c))
    {
        Err(e) => tracing::error!(error = %e, "SIGHUP: configuration not reloaded"),
        Ok(new) => {
            let level = new.server.log_level.clone();
            let restart = state.reload(new);
            if let Some(handle) = log {
                match EnvFilter::try_new(&level) {
                    Ok(f) => {
                        let _ = handle.reload(f);
                    }
                    Err(e) => tracing::warn!(error = %e, "SIGHUP: bad server.log_level kept out"),
                }
            }
            tracing::info!("SIGHUP: configuration reloaded (tokens, secrets, limits, named queries, keyspaces, identity, log level)");
            if !restart.is_empty() {
                tracing::warn!(sections = ?restart, "SIGHUP: these changes need a restart and were not applied");
            }
        }
    }
}

/// Binds a listener; a failure names the setting and the address (e.g. a port already taken).
fn bind(addr: &str, key: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr} ({key}): {e}")))
}

#[actix_web::main]
async fn serve(config: Config, path: Option<PathBuf>, log: LogHandle) -> std::io::Result<()> {
    let listen = config.server.listen.clone();
    let (redis_size, pg_size) = (config.redis.pool_size, config.postgres.pool_size);
    let state = AppState::new(config)
        .map_err(|e| std::io::Error::other(format!("cannot build the pools: {e}")))?;
    let listener = bind(&listen, "server.listen")?;
    {
        let state = state.clone();
        let mut hup = signal(SignalKind::hangup())?;
        actix_web::rt::spawn(async move {
            while hup.recv().await.is_some() {
                let (s, p) = (state.clone(), path.clone());
                // Reading files is blocking work: keep it off the event loop.
                let log = log.clone();
                let _ = actix_web::rt::task::spawn_blocking(move || reload(&s, p.as_deref(), &log))
                    .await;
            }
        });
    }
    tracing::info!(
        listen = %listener.local_addr()?,
        redis_pool = redis_size,
        postgres_pool = pg_size,
        "ferry-sidecar listening"
    );
    let main = ferry_sidecar::run(listener, state.clone())?;
    let admin_listen = state.config().server.admin_listen.clone();
    if admin_listen.is_empty() {
        let result = main.await;
        state.shutdown_background(std::time::Duration::from_secs(5));
        return result;
    }
    let admin = bind(&admin_listen, "server.admin_listen")?;
    tracing::info!(admin = %admin.local_addr()?, "metrics on GET /metrics");
    let background = state.clone();
    let admin = ferry_sidecar::admin(admin, state)?;
    let admin_handle = admin.handle();
    // The admin server stops with the main one (both handle SIGTERM themselves).
    let admin_task = actix_web::rt::spawn(admin);
    let result = main.await;
    admin_handle.stop(true).await;
    let _ = admin_task.await;
    background.shutdown_background(std::time::Duration::from_secs(5));
    result
}

//! The real sidecar app, served on 127.0.0.1 port 0 from a thread of its own.

use super::{PgServer, RedisServer, SECRET};
use ferry_sidecar::{AppState, Config};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

/// The sample config (deploy/ferry.toml, so its named queries and keyspaces are tested too),
/// with small pools and short timeouts so bounds and faults show quickly.
pub fn test_config(redis: &RedisServer, pg: &PgServer) -> Config {
    let sample = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ferry.toml");
    let env = std::collections::BTreeMap::from([("FERRY_SECRET".to_string(), SECRET.to_string())]);
    let mut c = Config::load(Some(&sample), &env).expect("deploy/ferry.toml loads");
    c.redis.url = redis.url().into();
    c.postgres.url = pg.url().into();
    // The superuser does everything here, Ferry's books included: one role, as the operator's
    // unsafe opt-in allows. Tests of the roles kept apart run the binary as the demo's roles.
    c.postgres.owner_url = "".into();
    c.postgres.single_role = true;
    // The tests are trusted callers that send their own SQL (the sample config refuses it).
    c.auth.allow_raw_sql = true;
    c.server.workers = 2;
    c.server.shutdown_timeout_s = 5;
    c.redis.checkout_timeout_ms = 500;
    c.redis.connect_timeout_ms = 300;
    c.redis.io_timeout_ms = 500;
    c.redis.retry_after_failure_ms = 300;
    c.cache.invalidation_retry_ms = 100;
    // /readyz answers from a background probe's snapshot: refresh it often in tests.
    c.server.readiness_interval_ms = 100;
    c
}

/// `c` logs in as the demo schema's least-privilege `ferry_app`, with Ferry's books kept by
/// `ferry_owner` (scripts/demo.sql), as deployed.
pub fn as_demo_roles(c: &mut Config, pg: &PgServer) {
    c.postgres.url = pg.url_as("ferry_app").into();
    c.postgres.owner_url = pg.url_as("ferry_owner").into();
    c.postgres.single_role = false;
}

/// Requests the in-process sidecars of this test process have answered on `route` (the
/// sidecar's own `ferry_requests_total`, every status).
pub fn requests_on(route: &str) -> u64 {
    let text = ferry_sidecar::metrics::global().render(&[]);
    let prefix = format!("ferry_requests_total{{route=\"{route}\",");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

pub struct Sidecar {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    handle: actix_web::dev::ServerHandle,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Sidecar {
    pub fn start(config: Config) -> Sidecar {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
        let addr = listener.local_addr().expect("local addr");
        let state = AppState::new(config).expect("sidecar state");
        let (tx, rx) = std::sync::mpsc::channel();
        let s = state.clone();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let server = ferry_sidecar::run(listener, s)?;
                let _ = tx.send(server.handle());
                server.await
            })
        });
        let handle = rx.recv().expect("sidecar started");
        Sidecar {
            addr,
            state,
            handle,
            thread: Some(thread),
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Graceful stop: in-flight requests finish, then the server thread ends.
    pub fn stop(&mut self) {
        // The stop command is sent on call; the thread join below waits for it to finish.
        drop(self.handle.stop(true));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.stop();
    }
}

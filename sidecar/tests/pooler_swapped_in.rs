//! A pooler that appears after startup. The probe that finds Ferry's Postgres sessions to be its
//! own ran against the sessions of its time; the address behind `postgres.url` can change under
//! a running sidecar (a failover, a DNS name moved to a hosted plan's pooled endpoint). The
//! adversary: the sidecar's connections reset, and every new one led to a transaction-mode
//! PgBouncer, set up as an operator following each error message would (the `options`
//! startup parameter dropped, the settings given to the role), so only the backend test can
//! tell. Without a probe again, end users' reads would run on sessions other clients share.
use ferry_testkit::{CutProxy, PgBouncer, PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn a_pooler_put_in_after_startup_is_found_and_refused() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "ALTER ROLE ferry_app SET default_transaction_read_only = on;
             ALTER ROLE ferry_app SET idle_in_transaction_session_timeout = '30s';
             ALTER ROLE ferry_app SET statement_timeout = '30s';",
        )
        .expect("the settings on the role");
    let bouncer = PgBouncer::start(pg.port, "transaction", &["ferry_app", "postgres"], true);
    let direct: std::net::SocketAddr = ([127, 0, 0, 1], pg.port).into();
    let proxy = CutProxy::start(direct);
    let url = format!("postgres://ferry_app@{}/postgres", proxy.addr);
    let env = [("FERRY_SERVER_READINESS_INTERVAL_MS", "100")];
    let sidecar = SidecarProcess::start(BIN, &redis.url(), &url, &env, Stdio::inherit());
    let c = &sidecar.client;
    let read = || c.query(json!({"sql": "SELECT count(*)::int AS n FROM items"}));
    assert_eq!(read().status, 200, "served while its sessions are its own");

    // Every connection from now on leads to the pooler; the live ones are cut.
    proxy.retarget(([127, 0, 0, 1], bouncer.port).into());
    proxy.reset();
    let swapped = Instant::now();
    let mut served_through_the_pooler = 0;
    let refused = loop {
        let r = read();
        match (r.status, r.code()) {
            (200, _) => served_through_the_pooler += 1,
            (503, "database_unavailable") if c.get("/readyz").status == 503 => {
                break Some(swapped.elapsed())
            }
            _ => {}
        }
        if swapped.elapsed() > Duration::from_secs(15) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "FIGURES pooler put in after startup: refused after {refused:?}, {served_through_the_pooler} \
         reads served before"
    );
    let refused = refused.expect("the sidecar went on serving through a transaction-mode pooler");
    assert!(refused < Duration::from_secs(10), "{refused:?}");
    // For good: the pooler is still there.
    for _ in 0..5 {
        let r = read();
        assert_eq!((r.status, r.code()), (503, "database_unavailable"));
    }
    drop(bouncer);
}

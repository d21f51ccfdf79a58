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

/// The same swap in front of a streaming replica (`[replicas]`, plain reads allowed there):
/// the replica is taken out of use, and reads go on, served by the primary. The servers'
/// own statistics say who served each read.
#[test]
fn a_pooler_put_in_front_of_a_replica_takes_it_out_of_use() {
    let redis = RedisServer::start();
    let primary = PgServer::start_with("-c synchronous_commit=on");
    primary
        .client()
        .batch_execute("CREATE TABLE swapped (id int PRIMARY KEY); INSERT INTO swapped VALUES (1);")
        .expect("table");
    let replica = PgServer::replica_of(&primary, "");
    let bouncer = PgBouncer::start(replica.port, "transaction", &["postgres"], true);
    let proxy = CutProxy::start(([127, 0, 0, 1], replica.port).into());
    let url = format!("postgres://postgres@{}/postgres", proxy.addr);
    let env = [
        ("FERRY_REPLICAS_URLS", url.as_str()),
        ("FERRY_REPLICAS_READS", "any"),
        ("FERRY_REPLICAS_POLL_MS", "20"),
    ];
    let sidecar = SidecarProcess::start(BIN, &redis.url(), &primary.url(), &env, Stdio::null());
    let c = &sidecar.client;
    let read = || {
        let r = c.query(json!({"sql": "SELECT id FROM swapped WHERE id = 1"}));
        assert_eq!(r.status, 200, "every read is served: {:?}", r.body);
    };
    let scans = |pg: &PgServer| -> i64 {
        pg.client()
            .query_one(
                "SELECT COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'swapped'",
                &[],
            )
            .expect("statistics")
            .get(0)
    };
    // Statistics are flushed by each backend at its transaction's end, at most once a second.
    let settled = |pg: &PgServer| {
        std::thread::sleep(Duration::from_millis(1_100));
        scans(pg)
    };
    ferry_testkit::wait_until(
        "the replica to serve reads",
        Duration::from_secs(20),
        || {
            let before = scans(&replica);
            (0..20).for_each(|_| read());
            settled(&replica) > before
        },
    );

    proxy.retarget(([127, 0, 0, 1], bouncer.port).into());
    proxy.reset();
    let swapped = Instant::now();
    // Out of use once a round of reads leaves the replica's count alone.
    let mut out_after = None;
    while swapped.elapsed() < Duration::from_secs(20) {
        let (replica_before, primary_before) = (scans(&replica), scans(&primary));
        (0..20).for_each(|_| read());
        if settled(&replica) == replica_before && settled(&primary) > primary_before {
            out_after = Some(swapped.elapsed());
            break;
        }
    }
    println!("FIGURES pooler put in front of a replica: out of use after at most {out_after:?}");
    assert!(
        out_after.is_some(),
        "reads went on through a transaction-mode pooler in front of the replica"
    );
    // And it stays out.
    let before = scans(&replica);
    (0..20).for_each(|_| read());
    assert_eq!(settled(&replica), before, "the replica was used again");
    drop(bouncer);
}

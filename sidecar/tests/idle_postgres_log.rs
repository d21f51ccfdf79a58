//! An idle sidecar asks Postgres nothing that fails: its once-a-second look for deferred
//! invalidations found no table on a healthy system (none is made until Redis first refuses
//! one) and Postgres logged `relation "ferry.deferred" does not exist` every second, forever,
//! each followed by a session reset. Postgres's own log judges.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

/// The sidecar binary over `pg` (given the demo schema), after one read through it.
fn after_one_read(redis: &RedisServer, pg: &PgServer) -> SidecarProcess {
    pg.setup_demo_schema();
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let a = s.client.query(serde_json::json!({"sql": "SELECT 1 AS n"}));
    assert_eq!(a.status, 200, "{}", a.body);
    s
}

#[test]
fn an_idle_sidecar_leaves_no_error_in_the_postgres_log() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    let s = after_one_read(&redis, &pg);
    let before = pg.server_log().len();
    // Three and a half of the background's one-second rounds.
    std::thread::sleep(Duration::from_millis(3_500));
    let log = pg.server_log();
    let errors: Vec<&str> = log[before..]
        .lines()
        .filter(|l| l.contains("ERROR:") || l.contains("STATEMENT:"))
        .collect();
    assert!(
        errors.is_empty(),
        "an idle sidecar made Postgres log errors:\n{}",
        errors.join("\n")
    );
    drop(s);
}

/// Nor does it reset sessions it left clean: each of those rounds ended in `DISCARD ALL`
/// (which a test counting resets after plain reads then met now and then). Postgres's own
/// count of the statements it ran judges.
#[test]
fn an_idle_sidecar_resets_no_session() {
    let redis = RedisServer::start();
    let pg = PgServer::start_counting();
    let s = after_one_read(&redis, &pg);
    // The read's own reset done, and the sidecar's first background rounds.
    std::thread::sleep(Duration::from_millis(1_500));
    let before = pg.statements("DISCARD ALL");
    std::thread::sleep(Duration::from_millis(3_500));
    let resets = pg.statements("DISCARD ALL") - before;
    assert_eq!(
        resets, 0,
        "an idle sidecar reset {resets} sessions in 3.5 s"
    );
    drop(s);
}

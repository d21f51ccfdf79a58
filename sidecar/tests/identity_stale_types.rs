//! An end user's read whose remembered parameter types went stale runs again the slow way, on
//! a session reset first (what the failed attempt left goes): it must run again as the same
//! end user, never as the login role. A writer that bypasses Ferry changes the column's type
//! under a statement Ferry has seen; the next read as Alice, on a pooled session and on a
//! worker's own, must see what Alice sees. The login role here reads every row (a policy of its
//! own), so a read that ran as it would show Bob's row and `current_user` = `ferry_app`.
//! Postgres's `current_user` and row-level security judge.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const READ: &str = "SELECT current_user::text AS u, owner FROM idsc WHERE k = $1 ORDER BY owner";

fn as_alice(s: &SidecarProcess, k: Value) -> Value {
    let a = s.client.query(json!({
        "sql": READ,
        "params": [k],
        "identity": {"role": "authenticated", "claims": {"sub": "alice"}},
    }));
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["rows"].clone()
}

#[test]
fn a_read_run_again_after_stale_types_is_still_the_end_users() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            "CREATE TABLE idsc (k text NOT NULL, owner text NOT NULL);
             INSERT INTO idsc VALUES ('1', 'alice'), ('1', 'bob');
             GRANT SELECT ON idsc TO authenticated, ferry_app;
             ALTER TABLE idsc ENABLE ROW LEVEL SECURITY;
             CREATE POLICY own ON idsc TO authenticated
               USING (owner = current_setting('request.jwt.claims', true)::json ->> 'sub');
             CREATE POLICY everything ON idsc TO ferry_app USING (true);",
        )
        .expect("schema");
    let app_url = pg.url().replace("postgres@", "ferry_app@");
    let start = |pool: &str| {
        let env = [
            ("FERRY_DATABASE_URL", app_url.as_str()),
            ("FERRY_IDENTITY_ROLES", "authenticated"),
            ("FERRY_IDENTITY_ALLOW_RAW_SQL", "true"),
            ("FERRY_POSTGRES_POOL_SIZE", pool),
        ];
        SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null())
    };
    // A pool of 2 over 2 workers leaves no event-loop session (every read is pooled); a pool
    // of 4 gives each worker one, which a lone read takes.
    let (pooled, on_loop) = (start("2"), start("4"));
    let alice = json!([{"u": "authenticated", "owner": "alice"}]);
    for s in [&pooled, &on_loop] {
        // Seen twice: the second run is sent with the remembered text type.
        assert_eq!(as_alice(s, json!("1")), alice);
        assert_eq!(as_alice(s, json!("1")), alice);
    }
    // No int4 = text operator: the remembered type fails the next run (42883).
    pg.client()
        .batch_execute("ALTER TABLE idsc ALTER k TYPE int4 USING k::int4")
        .expect("alter");
    for (s, path) in [(&pooled, "pooled"), (&on_loop, "event loop")] {
        assert_eq!(as_alice(s, json!("1")), alice, "{path}");
    }
}

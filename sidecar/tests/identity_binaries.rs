//! Per-user cache entries under the adversaries of a real deployment: two sidecar binaries
//! sharing one Redis (a user's entry filled through one must serve that user, and only that
//! user, through the other), and a writer that bypasses Ferry (psql): the change stream must
//! make every user's entry of the table fresh within the bound. Both binaries log in as the
//! plain `ferry_app` and run the demo's row-level security (scripts/demo.sql); Postgres's rows
//! and `current_user` judge.
mod change_stream_common;
use change_stream_common as cs;
use ferry_testkit::{RedisServer, SidecarProcess};
use serde_json::json;
use std::time::Instant;

fn notes(s: &SidecarProcess, sub: &str) -> (Vec<String>, String) {
    let a = s.client.query(json!({
        "query": "my_notes",
        "identity": {"role": "authenticated", "claims": {"sub": sub}},
        "cache": {"ttl_s": 600, "tables": ["notes"]}
    }));
    assert_eq!(a.status, 200, "{}", a.body);
    let bodies = a.body["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["body"].as_str().unwrap_or("").to_string())
        .collect();
    (bodies, a.body["cache"].as_str().unwrap_or("").to_string())
}

#[test]
fn two_sidecars_and_an_outside_writer_keep_each_users_entries_theirs_and_fresh() {
    let redis = RedisServer::start();
    // scripts/demo.sql publishes notes to the change stream, and lets ferry_changes read it.
    let pg = cs::logical_pg();
    let app_url = pg.url().replace("postgres@", "ferry_app@");
    let env = [
        ("FERRY_CHANGES_TABLES", "orders,notes"),
        ("FERRY_DATABASE_URL", app_url.as_str()),
    ];
    let (a, b) = (
        cs::spawn_with(&redis, &pg, &env),
        cs::spawn_with(&redis, &pg, &env),
    );
    cs::wait_caught_up(&a);
    cs::wait_caught_up(&b);
    let alice2 = vec![
        "alice's first note".to_string(),
        "alice's second note".to_string(),
    ];
    let bob1 = vec!["bob's note".to_string()];

    // Alice's entry, filled through A, serves Alice through B; Bob through B gets his own.
    assert_eq!(notes(&a, "alice"), (alice2.clone(), "miss".into()));
    assert_eq!(notes(&b, "alice"), (alice2.clone(), "hit".into()));
    assert_eq!(notes(&b, "bob"), (bob1.clone(), "miss".into()));
    assert_eq!(notes(&a, "bob"), (bob1.clone(), "hit".into()));

    // psql adds a note for Alice: after the bound her next read, through either sidecar, has
    // it; Bob's rows are unchanged.
    pg.client()
        .batch_execute("INSERT INTO notes (owner, body) VALUES ('alice', 'from psql')")
        .expect("insert");
    cs::after_bound(Instant::now());
    let (rows, _) = notes(&b, "alice");
    assert_eq!(
        rows.last().map(String::as_str),
        Some("from psql"),
        "{rows:?}"
    );
    assert_eq!(notes(&a, "alice").0.len(), 3);
    assert_eq!(notes(&a, "bob").0, bob1);

    // Every session both binaries used comes back as the login role, with no claims.
    for s in [&a, &b] {
        for _ in 0..12 {
            let w = s.client.query(json!({
                "sql": "SELECT current_user::text AS u, \
                        current_setting('request.jwt.claims', true) AS c"
            }));
            assert_eq!(w.status, 200, "{}", w.body);
            assert_eq!(w.body["rows"][0]["u"], "ferry_app", "{}", w.body);
            let c = &w.body["rows"][0]["c"];
            assert!(c.is_null() || c == "", "claims left behind: {c}");
        }
    }
}

//! Interactive transactions never take the pool from writes: with the sample's defaults
//! (postgres.pool_size 10, two workers: four pooled connections that writes share), as many
//! transactions as the cap allows are held open by a caller who never ends them, and every
//! write sent meanwhile still commits (Postgres's rows judge).
use ferry_testkit::DemoBinary;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

#[test]
fn open_transactions_leave_writes_a_connection() {
    let demo = DemoBinary::start(BIN, &[("FERRY_POSTGRES_POOL_SIZE", "10")]);
    let c = &demo.sidecar.client;
    let mut held = 0;
    for _ in 0..6 {
        let r = c.block_on(c.post("/v1/transaction/begin", &json!({})));
        match r.status {
            200 => held += 1,
            503 => assert_eq!(r.code(), "overloaded", "{}", r.body),
            s => panic!("begin answered {s}: {}", r.body),
        }
    }
    assert!(held >= 1, "no interactive transaction could begin");
    let writes = c.block_on(futures::future::join_all((0..14).map(|i| {
        let c = c.clone();
        async move {
            c.post(
                "/v1/execute",
                &json!({ "sql": "UPDATE items SET name = $1 WHERE id = $2",
                         "params": [format!("w{i}"), 100 + i] }),
            )
            .await
        }
    })));
    for (i, w) in writes.iter().enumerate() {
        assert_eq!(
            w.status, 200,
            "write {i} with {held} transactions open: {}",
            w.body
        );
    }
    let written: i64 = demo
        .pg
        .client()
        .query_one("SELECT count(*) FROM items WHERE name LIKE 'w%'", &[])
        .expect("rows")
        .get(0);
    assert_eq!(written, 14);
}

#[test]
fn a_cap_that_would_take_every_pooled_connection_is_refused() {
    let out = std::process::Command::new(BIN)
        .arg("--check-config")
        .env_clear()
        .env("FERRY_SECRET", ferry_testkit::SECRET)
        .env("FERRY_POSTGRES_SINGLE_ROLE", "true")
        .env("FERRY_SERVER_WORKERS", "2")
        .env("FERRY_POSTGRES_POOL_SIZE", "10")
        .env("FERRY_LIMITS_MAX_OPEN_TRANSACTIONS", "4")
        .output()
        .expect("run --check-config");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {text}");
    assert!(text.contains("limits.max_open_transactions"), "{text}");
}

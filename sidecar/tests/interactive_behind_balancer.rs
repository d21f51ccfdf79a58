//! Interactive transactions with several sidecars behind the sample balancer
//! (deploy/nginx/ferry-balancer.conf), as deployed: a transaction lives on the one sidecar that
//! began it, so its later requests must reach that one. A round-robin balancer sends them to the
//! others, which do not know the id (404) and never see the commit. Requests that carry the
//! same `x-ferry-affinity` (any value the client picks for the transaction) go to the same
//! sidecar. Postgres's rows judge what committed.
use ferry_testkit::client::Answer;
use ferry_testkit::{Balancer, Client, PgServer, RedisServer, SidecarProcess, SECRET};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn post(c: &Client, path: &str, body: Value, affinity: &str) -> Answer {
    let bytes = serde_json::to_vec(&body).expect("json");
    let mut headers = c.signed_now("POST", path, &bytes);
    headers.push((ferry_shared::api::AFFINITY_HEADER, affinity.to_string()));
    c.raw("POST", path, bytes, &headers)
}

#[test]
fn a_transactions_requests_with_one_affinity_reach_the_sidecar_that_holds_it() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let sidecars: Vec<SidecarProcess> = (0..3)
        .map(|_| SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null()))
        .collect();
    let ports: Vec<u16> = sidecars.iter().map(|s| s.port).collect();
    let lb = Balancer::start(&ports);
    let c = Client::new(&lb.url(), SECRET);
    let mut wrong = Vec::new();
    for i in 0..12 {
        let affinity = format!("{:032x}", rand::random::<u128>());
        let begun = post(&c, "/v1/transaction/begin", json!({}), &affinity);
        if begun.status != 200 {
            // (Transactions stranded on other sidecars hold their connections until reaped.)
            wrong.push(format!("tx {i}: begin {} {}", begun.status, begun.body));
            continue;
        }
        let id = begun.body["id"].clone();
        let sql = format!("UPDATE items SET name = 'tx {i}' WHERE id = {}", 100 + i);
        let q = post(
            &c,
            "/v1/transaction/query",
            json!({"id": id, "sql": sql}),
            &affinity,
        );
        let done = post(&c, "/v1/transaction/commit", json!({"id": id}), &affinity);
        if (q.status, done.status) != (200, 200) {
            wrong.push(format!(
                "tx {i}: query {} {}, commit {} {}",
                q.status, q.body, done.status, done.body
            ));
        }
    }
    let committed: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM items WHERE name LIKE 'tx %'", &[])
        .expect("count")
        .get(0);
    assert!(
        wrong.is_empty(),
        "{} of 12 transactions failed: {wrong:#?}",
        wrong.len()
    );
    assert_eq!(committed, 12, "every acknowledged commit is in Postgres");
}

//! A keyspace keyed by a column outside the table's replica identity (`sku`, unique, not the
//! primary key): the stream's old row then carries only the key (`id`), and the keyspace's old
//! id must be taken as unknown, never as "no row". Against the binary, a private logical
//! Postgres and Redis; Postgres's rows judge what is fresh.
use ferry_testkit::{RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::time::Instant;

mod change_stream_common;
use change_stream_common::*;

const CONFIG: &str = r#"
[keyspaces.skus]
sql = "SELECT sku, qty FROM stock WHERE sku = ANY($1)"
key_column = "sku"
ttl_s = 600
table = "stock"
"#;

fn keyed(s: &SidecarProcess, skus: &[&str]) -> Value {
    let body = json!({"keyspace": "skus", "ids": skus});
    let a = s.client.block_on(s.client.post("/v1/batch/keyed", &body));
    assert_eq!(a.status, 200, "{:?}", a.body);
    a.body["results"].clone()
}

/// Warm: each sku read until its entry is a hit.
fn warm(s: &SidecarProcess, skus: &[&str]) {
    wait_caught_up(s);
    keyed(s, skus);
    let r = keyed(s, skus);
    for (i, sku) in skus.iter().enumerate() {
        assert_eq!(r[i]["status"], "hit", "{sku}: {r:?}");
    }
}

#[test]
fn a_delete_or_a_moved_key_outside_the_identity_is_seen_by_the_next_read() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    pg.client()
        .batch_execute(
            "CREATE TABLE stock (id int PRIMARY KEY, sku text UNIQUE NOT NULL, qty int NOT NULL);
             INSERT INTO stock VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3);
             GRANT SELECT ON stock TO ferry_changes;
             ALTER PUBLICATION ferry ADD TABLE stock;",
        )
        .expect("stock");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ferry.toml");
    std::fs::write(&file, CONFIG).expect("config");
    let s = spawn_with(
        &redis,
        &pg,
        &[
            ("FERRY_CONFIG", file.to_str().expect("utf-8")),
            ("FERRY_CHANGES_TABLES", "orders,stock"),
        ],
    );
    let mut psql = pg.client();
    warm(&s, &["a", "b", "c"]);

    // DELETE: the stream's old row is (1, NULL, NULL): its sku was not sent.
    psql.execute("DELETE FROM stock WHERE sku = 'a'", &[])
        .expect("delete");
    // A key change: the old row is sent (the identity changed), its sku is not.
    psql.execute("UPDATE stock SET id = 20, sku = 'z' WHERE sku = 'b'", &[])
        .expect("move");
    after_bound(Instant::now());
    wait_caught_up(&s);
    let r = keyed(&s, &["a", "b", "z"]);
    assert_eq!(
        r[0]["status"], "not_found",
        "a deleted row was served: {r:?}"
    );
    assert_eq!(r[1]["status"], "not_found", "a moved row was served: {r:?}");
    assert_eq!(r[2]["row"]["qty"], 2, "{r:?}");

    // An INSERT carries every value: it moves its own sku only, and keeps the others' hits.
    warm(&s, &["c", "z"]);
    psql.execute("INSERT INTO stock VALUES (4, 'd', 4)", &[])
        .expect("insert");
    after_bound(Instant::now());
    wait_caught_up(&s);
    let r = keyed(&s, &["c", "d"]);
    assert_eq!(
        r[0]["status"], "hit",
        "an insert dropped another row: {r:?}"
    );
    assert_eq!(r[1]["row"]["qty"], 4, "{r:?}");
}

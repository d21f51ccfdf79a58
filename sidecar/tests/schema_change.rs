//! A writer that bypasses Ferry changes the schema under a statement Ferry has seen. Repeated
//! statements run in one round trip with the parameter types Postgres gave the first time
//! (`store/postgres/param_types.rs`); those types must never outlive the schema. On the binary, with a
//! Postgres pool of one (every request reuses the session, and the remembered types), the same
//! statements keep working after `ALTER TABLE ... TYPE` from psql, reads and writes alike, and
//! a value that is wrong for the current type is still a clear 400.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const READ: &str = "SELECT id FROM sc WHERE v = $1 ORDER BY id";
const WRITE: &str = "UPDATE sc SET v = $1 WHERE id = $2";

fn ids(a: &ferry_testkit::client::Answer) -> Vec<i64> {
    assert_eq!(a.status, 200, "{:?}", a.body);
    a.body["rows"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r["id"].as_i64()).collect())
        .unwrap_or_default()
}

#[test]
fn remembered_parameter_types_never_outlive_the_schema() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    let mut admin = pg.client();
    admin
        .batch_execute(
            "CREATE TABLE sc (id int PRIMARY KEY, v int4);
             INSERT INTO sc VALUES (1, 10), (2, 20);",
        )
        .expect("schema");
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url(),
        &[("FERRY_POSTGRES_POOL_SIZE", "1")],
        Stdio::null(),
    );
    let c = &s.client;
    let read = |v: Value| c.query(json!({"sql": READ, "params": [v]}));
    let write = |v: Value, id: i64| c.execute(json!({"sql": WRITE, "params": [v, id]}));

    // Seen twice: the second run uses the remembered int4.
    assert_eq!(ids(&read(json!(10))), vec![1]);
    assert_eq!(ids(&read(json!(20))), vec![2]);
    assert_eq!(write(json!(11), 1).status, 200);
    assert_eq!(write(json!(10), 1).status, 200);

    // Another writer widens the column: 1.5 does not read as the remembered int4.
    admin
        .batch_execute("ALTER TABLE sc ALTER v TYPE numeric; UPDATE sc SET v = 1.5 WHERE id = 2")
        .expect("alter to numeric");
    assert_eq!(
        ids(&read(json!(1.5))),
        vec![2],
        "read after int4 -> numeric"
    );
    let w = write(json!(2.25), 1);
    assert_eq!(w.status, 200, "write after int4 -> numeric: {:?}", w.body);
    assert_eq!(w.body["rows_affected"], 1, "{:?}", w.body);
    assert_eq!(ids(&read(json!(2.25))), vec![1]);

    // And turns it into text: no numeric = text operator for the remembered numeric.
    admin
        .batch_execute("ALTER TABLE sc ALTER v TYPE text USING v::text")
        .expect("alter to text");
    let w = write(json!("lamp"), 2);
    assert_eq!(w.status, 200, "write after numeric -> text: {:?}", w.body);
    assert_eq!(
        ids(&read(json!("lamp"))),
        vec![2],
        "read after numeric -> text"
    );
    let stored: String = admin
        .query_one("SELECT v FROM sc WHERE id = 2", &[])
        .expect("row")
        .get(0);
    assert_eq!(stored, "lamp", "the write landed as sent");

    // A value wrong for the current type is still the caller's error, with Postgres' code.
    let bad = c.query(json!({"sql": "SELECT id FROM sc WHERE id = $1", "params": ["x"]}));
    let bad_again = c.query(json!({"sql": "SELECT id FROM sc WHERE id = $1", "params": ["x"]}));
    for a in [&bad, &bad_again] {
        assert_eq!(a.status, 400, "{:?}", a.body);
        assert_eq!(a.code(), "bad_params", "{:?}", a.body);
    }
    assert_eq!(
        ids(&c.query(json!({"sql": "SELECT id FROM sc WHERE id = $1", "params": [2]}))),
        vec![2]
    );
}

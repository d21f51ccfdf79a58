//! A hit answers its entry's rows as the JSON text Redis holds, without decoding them: the
//! answer must be the rows the fill answered, value for value, whatever their types; and an
//! entry whose rows are not an array (Ferry never writes one; someone with Redis's password
//! may) is not an answer.
use ferry_testkit as common;
use serde_json::{json, Value};

/// Every kind of value a row carries, with the characters JSON escapes, floats that need all
/// their digits, nesting, nulls and empty values.
const SQL: &str = r#"SELECT g AS id,
    E'tab\t "quote" back\\slash \u2603 nul-free \u0001 end' AS text,
    0.1::float8 * g AS f, 1e300::float8 AS big, -0.0::float8 AS neg_zero,
    12345678901234567890.0123456789::numeric AS n, 9007199254740993::int8 AS beyond_f64,
    '{"a": [1, {"b": null}], "z": "ü", "e": {}}'::jsonb AS j,
    ARRAY[1, NULL, 3] AS arr, ARRAY[]::text[] AS empty, NULL::text AS nothing, g = 1 AS yes,
    '2024-01-02 03:04:05+00'::timestamptz AS at, '\x00ff'::bytea AS bytes, '' AS blank
  FROM generate_series(1, $1::int) g"#;

fn read(n: i64) -> Value {
    json!({"sql": SQL, "params": [n], "cache": {"ttl_s": 60, "tables": ["items"]}})
}

#[test]
fn a_hit_answers_the_rows_the_fill_answered() {
    let stack = common::Stack::start();
    let c = &stack.client;
    for n in [0, 1, 3] {
        let miss = c.query(read(n));
        assert_eq!(miss.status, 200, "{:?}", miss.body);
        assert_eq!(miss.body["cache"], "miss");
        assert_eq!(miss.body["rows"].as_array().map(Vec::len), Some(n as usize));
        for _ in 0..2 {
            let hit = c.query(read(n));
            assert_eq!(hit.status, 200, "{:?}", hit.body);
            assert_eq!(hit.body["cache"], "hit");
            assert_eq!(hit.body["rows"], miss.body["rows"], "rows of {n}");
        }
    }
    // A batch's hits answer the same rows, each in its place.
    let reads = json!({"reads": [read(3), {"sql": "SELECT 1 AS one"}, read(1)]});
    let b = c.block_on(c.post("/v1/batch", &reads));
    assert_eq!(b.status, 200, "{:?}", b.body);
    let results = b.body["results"].as_array().expect("results");
    assert_eq!(results[0]["ok"]["cache"], "hit");
    assert_eq!(results[0]["ok"]["rows"], c.query(read(3)).body["rows"]);
    assert_eq!(results[1]["ok"]["rows"], json!([{"one": 1}]));
    assert_eq!(results[2]["ok"]["rows"], c.query(read(1)).body["rows"]);
}

#[test]
fn an_entry_whose_rows_are_not_an_array_is_not_served() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let miss = c.query(read(2));
    assert_eq!(miss.body["cache"], "miss", "{:?}", miss.body);
    let key = format!("ferry:q:{}", miss.body["key"].as_str().expect("key"));
    // The entry, valid in every other way, its rows replaced by an object.
    let mut r = stack.redis.conn();
    // The write-back follows the answer: the entry lands a round trip later.
    let mut stored: Option<String> = None;
    for _ in 0..200 {
        stored = redis::cmd("GET").arg(&key).query(&mut r).expect("GET");
        if stored.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let stored = stored.expect("the miss's entry reached Redis");
    let mut entry: Value = serde_json::from_str(&stored).expect("an entry is JSON");
    entry["rows"] = json!({"injected": true});
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(entry.to_string())
        .arg("KEEPTTL")
        .query(&mut r)
        .expect("SET");
    let after = c.query(read(2));
    assert_eq!(after.status, 200, "{:?}", after.body);
    assert_eq!(after.body["cache"], "miss", "{:?}", after.body);
    assert_eq!(after.body["rows"], miss.body["rows"]);
    let hit = c.query(read(2));
    assert_eq!(hit.body["cache"], "hit");
    assert_eq!(hit.body["rows"], miss.body["rows"]);
}

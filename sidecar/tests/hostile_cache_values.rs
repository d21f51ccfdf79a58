//! Cached strings are written into answers by Ferry's own JSON writer (`http/json_out.rs`), not
//! serde_json. A hostile caller stores values built to break out of their JSON string (quotes,
//! backslashes, every control byte, a fake closing of the answer) and an outside writer puts
//! raw bytes in Redis behind Ferry's back; every other caller's `get` and `mget` must still
//! parse as JSON and give back exactly the stored string, nothing more. Against the binary and a
//! private Redis.
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

fn hostile_values() -> Vec<String> {
    let controls: String = (0u8..0x20).map(char::from).collect();
    vec![
        r#"","op":"get","value":"injected"#.to_string(),
        r#"\"}],"values":["x"]}"#.to_string(),
        "\\".repeat(33),
        "\"".repeat(40 * 1024),
        controls.clone(),
        format!("{controls}\u{7f}ünïcødé ✓ 🚀{controls}"),
        format!("{}\"{}", "a".repeat(31), "b".repeat(33)),
        String::new(),
    ]
}

#[test]
fn hostile_strings_come_back_exactly_and_never_break_the_answer() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    let s = SidecarProcess::start(BIN, &redis.url(), &pg.url(), &[], Stdio::null());
    let values = hostile_values();
    let keys: Vec<String> = (0..values.len()).map(|i| format!("h{i}")).collect();
    // The hostile caller writes them, one by one and in one mset.
    for (k, v) in keys.iter().zip(&values) {
        let a = s.client.cache(json!({"op": "set", "key": k, "value": v}));
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let entries: Vec<Value> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| json!({"key": format!("m-{k}"), "value": v}))
        .collect();
    let a = s.client.cache(json!({"op": "mset", "entries": entries}));
    assert_eq!(a.status, 200, "{}", a.body);
    // An outside writer, straight into Redis under Ferry's key layout.
    let _: () = ::redis::cmd("SET")
        .arg("ferry:k:outside")
        .arg("line\nbreak \"quoted\" \\ tab\t end")
        .query(&mut redis.conn())
        .expect("outside write");

    // Every other caller's answers: valid JSON (the client parsed it), exactly the strings.
    for (k, v) in keys.iter().zip(&values) {
        let a = s.client.cache(json!({"op": "get", "key": k}));
        assert_eq!(a.status, 200, "{k}: {}", a.body);
        assert_eq!(a.body, json!({"op": "get", "value": v}), "{k}");
    }
    let mut all: Vec<String> = keys.iter().map(|k| format!("m-{k}")).collect();
    all.push("outside".into());
    all.push("missing".into());
    let a = s.client.cache(json!({"op": "mget", "keys": all}));
    assert_eq!(a.status, 200, "{}", a.body);
    let mut expected: Vec<Value> = values.iter().map(|v| json!(v)).collect();
    expected.push(json!("line\nbreak \"quoted\" \\ tab\t end"));
    expected.push(Value::Null);
    assert_eq!(a.body, json!({"op": "mget", "values": expected}));
}

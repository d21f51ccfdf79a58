//! Large `get` / `mget` answers (API.md, `POST /v1/cache`): streamed, yet checked whole before
//! the status goes. A value that is not UTF-8 anywhere in the answer, even the last byte of the
//! last value, is a 422 `not_text` and no value; a 200 carries every value exactly as
//! serde_json writes it, with its length announced up front.
use ferry_testkit as common;
use serde_json::{json, Value};

const BIG: usize = 50 * 1024;

/// Stores raw bytes under a caller-managed key, as another Redis client would.
fn store(stack: &common::Stack, key: &str, value: &[u8]) {
    redis::cmd("SET")
        .arg(format!("ferry:k:{key}"))
        .arg(value)
        .query::<()>(&mut stack.redis.conn())
        .expect("set raw");
}

/// Text of `n` bytes with `special` at `at` (or none).
fn text(n: usize, special: Option<(usize, &str)>) -> String {
    let mut s = "x".repeat(n);
    if let Some((at, c)) = special {
        s.replace_range(at..at + c.len(), c);
    }
    s
}

#[test]
fn a_large_mget_answers_every_value_exactly_with_its_length_up_front() {
    let stack = common::Stack::start();
    let c = &stack.client;
    // Clean values (sent uncopied), values that need escaping at their start, middle and end,
    // multi-byte text, a missing key, and small values between the large ones.
    let mut expected: Vec<Value> = Vec::new();
    let mut keys = Vec::new();
    for i in 0..60 {
        let key = format!("big{i}");
        let value = match i % 6 {
            0 => Some(text(BIG, None)),
            1 => Some(text(BIG, Some((0, "\"")))),
            2 => Some(text(BIG, Some((BIG / 2, "\n")))),
            3 => Some(text(BIG, Some((BIG - 1, "\\")))),
            4 => Some(format!("{}✓ü", text(BIG - 5, None))),
            _ if i % 12 == 5 => None,
            _ => Some(format!("small {i} \u{1}")),
        };
        if let Some(v) = &value {
            store(&stack, &key, v.as_bytes());
        }
        expected.push(value.map_or(Value::Null, Value::String));
        keys.push(key);
    }
    let want = json!({"op": "mget", "values": expected});
    let r = c.cache(json!({"op": "mget", "keys": keys}));
    assert_eq!(r.status, 200, "{:?}", r.code());
    assert!(
        r.body == want,
        "the mget's values differ from what Redis holds"
    );
    let len = serde_json::to_vec(&want).expect("json").len();
    assert_eq!(
        r.headers
            .get("content-length")
            .and_then(|v| v.to_str().ok()),
        Some(len.to_string().as_str()),
        "the answer's length, announced before it, is serde_json's"
    );
    assert!(r.headers.get("transfer-encoding").is_none());

    let r = c.cache(json!({"op": "get", "key": "big0"}));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, json!({"op": "get", "value": text(BIG, None)}));
}

#[test]
fn a_value_that_is_not_text_anywhere_refuses_the_whole_answer_before_any_byte() {
    let stack = common::Stack::start();
    let c = &stack.client;
    let keys: Vec<String> = (0..100).map(|i| format!("v{i}")).collect();
    for k in &keys {
        store(&stack, k, text(BIG, None).as_bytes());
    }
    // The one bad byte in turn: the first value's first byte, a middle value's middle, the last
    // value's last byte (after 5 MB of clean values a streamed answer would have sent).
    for (at, byte) in [(0usize, 0usize), (50, BIG / 2), (99, BIG - 1)] {
        let mut bad = text(BIG, None).into_bytes();
        bad[byte] = 0xff;
        store(&stack, &keys[at], &bad);
        let r = c.cache(json!({"op": "mget", "keys": keys}));
        assert_eq!(r.status, 422, "value {at}, byte {byte}: {:?}", r.body);
        assert_eq!(r.code(), "not_text");
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(&keys[at])),
            "names the key: {:?}",
            r.body
        );
        assert!(r.body.get("values").is_none(), "no value with the refusal");
        let r = c.cache(json!({"op": "get", "key": keys[at]}));
        assert_eq!(r.status, 422, "get of value {at}");
        assert_eq!(r.code(), "not_text");
        store(&stack, &keys[at], text(BIG, None).as_bytes());
    }
    let r = c.cache(json!({"op": "mget", "keys": keys}));
    assert_eq!(r.status, 200, "every value is text again");
    assert_eq!(r.body["values"].as_array().map(Vec::len), Some(100));
}

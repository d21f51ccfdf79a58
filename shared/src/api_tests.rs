//! Unit tests of `api.rs` (kept apart so the module stays short).
use super::*;
use serde_json::json;

#[test]
fn query_request_minimal_and_full() {
    let r: QueryRequest = serde_json::from_value(json!({"sql": "select 1"})).expect("minimal");
    assert!(r.params.is_empty() && r.cache.is_none() && r.query.is_none());
    let r: QueryRequest = serde_json::from_value(
        json!({"sql": "select $1", "params": [1], "cache": {"ttl_s": 60, "key": "k"}}),
    )
    .expect("full");
    assert_eq!(r.cache.and_then(|c| c.key).as_deref(), Some("k"));
    let r: QueryRequest = serde_json::from_value(
        json!({"query": "item", "cache": {"mode": "no-cache", "tags": ["t"]}}),
    )
    .expect("named");
    let cache = r.cache.expect("cache");
    assert_eq!(cache.mode, CacheMode::NoCache);
    assert_eq!(cache.tags, vec!["t".to_string()]);
}

#[test]
fn numbers_survive_a_round_trip_exactly() {
    // Found by the decode_requests fuzz target: without serde_json's float_roundtrip, a
    // parameter could come back 1 ULP off after parse -> print -> parse.
    let raw = r#"{"keyspace": "k", "ids": [4.489000000000001e109, 0.1, 1e-300]}"#;
    let k: KeyedRequest = serde_json::from_str(raw).expect("decodes");
    let again: KeyedRequest =
        serde_json::from_str(&serde_json::to_string(&k).expect("encodes")).expect("decodes");
    assert_eq!(k, again);
}

#[test]
fn batch_results_are_tagged() {
    let ok = serde_json::to_value(BatchResult::<Vec<Row>>::Error(
        crate::ErrorBody::new(crate::ErrorCode::SqlError, "x").error,
    ))
    .expect("ser");
    assert_eq!(ok["error"]["code"], "sql_error");
}

#[test]
fn unknown_fields_are_refused() {
    let r: Result<QueryRequest, _> =
        serde_json::from_value(json!({"sql": "select 1", "cahce": {}}));
    assert!(r.is_err());
    let r: Result<CacheCommand, _> =
        serde_json::from_value(json!({"op": "get", "key": "a", "extra": 1}));
    assert!(r.is_err());
}

#[test]
fn cache_commands_are_tagged_by_op() {
    let c: CacheCommand = serde_json::from_value(json!({"op": "incr", "key": "n"})).expect("incr");
    assert_eq!(
        c,
        CacheCommand::Incr {
            key: "n".into(),
            by: 1
        }
    );
    let reply = serde_json::to_value(CacheReply::Get { value: None }).expect("ser");
    assert_eq!(reply, json!({"op": "get", "value": null}));
}

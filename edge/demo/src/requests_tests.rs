//! Route inputs and the sidecar requests they become.
use super::*;
use serde_json::json;

#[test]
fn ids() {
    assert_eq!(parse_id("42"), Ok(42));
    for bad in ["0", "-1", "abc", "", "1.5", "99999999999"] {
        assert!(parse_id(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_ids(Some("ids=3,1,3,2")), Ok(vec![3, 1, 2]));
    assert_eq!(parse_ids(Some("x=1&ids=5")), Ok(vec![5]));
    assert!(parse_ids(Some("ids=")).is_err());
    assert!(parse_ids(None).is_err());
    assert!(parse_ids(Some("ids=1,x")).is_err());
    let many = (1..=101)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    assert!(parse_ids(Some(&format!("ids={many}"))).is_err());
    // Duplicates count against the cap: 101 ids of one value are refused, unparsed.
    let same = vec!["1"; 101].join(",");
    assert!(parse_ids(Some(&format!("ids={same}"))).is_err());
    let hundred = vec!["1"; 100].join(",");
    assert_eq!(parse_ids(Some(&format!("ids={hundred}"))), Ok(vec![1]));
}

/// A handle whose calls are never made: these tests look at the requests only.
fn ferry() -> Ferry {
    ferry_edge::Ferry::offline()
}

#[test]
fn item_requests() {
    let q = item(&ferry(), 7);
    let q = q.request();
    assert_eq!(q.query.as_deref(), Some("item"));
    assert!(q.sql.is_none(), "the edge sends no raw SQL");
    assert_eq!(q.params, vec![json!(7)]);
    assert_eq!(
        q.cache.as_ref().and_then(|c| c.key.as_deref()),
        Some("items:7")
    );
}

#[test]
fn upserts() {
    let f = ferry();
    let e = item_upsert(&f, 3, br#"{"name": " lamp ", "price": "12.50"}"#).expect("valid");
    let e = e.request();
    assert_eq!(e.params, vec![json!(3), json!("lamp"), json!("12.50")]);
    assert_eq!(e.query.as_deref(), Some("upsert_item"));
    assert_eq!(
        e.invalidate.as_ref().map(|i| i.keys.clone()),
        Some(vec!["items:3".to_string()])
    );
    assert!(item_upsert(&f, 3, br#"{"name": "x", "price": 2.5}"#).is_ok());
    for bad in [
        &br#"{"name": "", "price": 1}"#[..],
        br#"{"name": "x"}"#,
        br#"{"name": "x", "price": true}"#,
        br#"{"name": "x", "price": "NaN"}"#,
        br#"{"name": "x", "price": -1}"#,
        br#"{"name": "x", "price": "-0.50"}"#,
        br#"{"name": "x", "price": 1e300}"#,
        br#"{"name": "x", "price": "100000000.00"}"#,
        br#"{"name": "x", "price": "1.005"}"#,
        br#"{"name": "x", "price": 1, "extra": 1}"#,
        b"not json",
    ] {
        assert!(item_upsert(&f, 3, bad).is_err());
    }
}

#[test]
fn many_upserts_are_one_transaction() {
    let f = ferry();
    let body = br#"{"items": [{"id": 4, "name": "desk", "price": 80},
                              {"id": 9, "name": " chair ", "price": "40.00"}]}"#;
    let tx = items_upsert(&f, body).expect("valid");
    let tx = tx.request();
    let params: Vec<_> = tx.statements.iter().map(|s| s.params.clone()).collect();
    assert_eq!(
        params,
        [
            vec![json!(4), json!("desk"), json!("80")],
            vec![json!(9), json!("chair"), json!("40.00")]
        ]
    );
    assert!(tx
        .statements
        .iter()
        .all(|s| s.query.as_deref() == Some("upsert_item")));
    let keys = tx.invalidate.as_ref().map(|i| i.keys.clone());
    assert_eq!(
        keys,
        Some(vec!["items:4".to_string(), "items:9".to_string()])
    );
    let one = |i: usize| format!(r#"{{"id": {}, "name": "x", "price": 1}}"#, i + 1);
    let many = (0..=MAX_BATCH).map(one).collect::<Vec<_>>().join(",");
    for (bad, field) in [
        (r#"{"items": []}"#.to_string(), Some("items")),
        (format!(r#"{{"items": [{many}]}}"#), Some("items")),
        (
            r#"{"items": [{"id": 0, "name": "x", "price": 1}]}"#.into(),
            Some("items[0].id"),
        ),
        (
            format!(r#"{{"items": [{}, {}]}}"#, one(0), one(0)),
            Some("items[1].id"),
        ),
        (
            r#"{"items": [{"id": 1, "name": "", "price": 1}]}"#.into(),
            Some("items[0].name"),
        ),
        (r#"{"items": [{"id": 1, "name": "x"}]}"#.into(), None),
        (
            r#"{"items": [{"id": 1, "name": "x", "price": 1, "more": 1}]}"#.into(),
            None,
        ),
        (r#"[1]"#.into(), None),
    ] {
        let e = items_upsert(&f, bad.as_bytes()).err().expect(&bad);
        assert_eq!(e.status(), 400, "{bad}");
        assert_eq!(e.body().error.field.as_deref(), field, "{bad}");
    }
}

#[test]
fn cache_bodies() {
    assert_eq!(
        cache_set("k", br#"{"value": "v"}"#),
        Ok(CacheCommand::Set {
            key: "edge:k".into(),
            value: "v".into(),
            ttl_s: Some(DEFAULT_CACHE_TTL_S)
        })
    );
    assert!(cache_set("k", br#"{"value": 1}"#).is_err());
    let big = format!(
        r#"{{"value": "{}"}}"#,
        "x".repeat(MAX_CACHE_VALUE_BYTES + 1)
    );
    assert!(cache_set("k", big.as_bytes()).is_err());
    for ttl in [0, MAX_CACHE_TTL_S + 1] {
        let body = format!(r#"{{"value": "v", "ttl_s": {ttl}}}"#);
        assert!(cache_set("k", body.as_bytes()).is_err(), "{ttl}");
    }
    assert!(parse_cache_key("").is_err());
    assert!(parse_cache_key("a\nb").is_err());
    assert!(parse_cache_key("user:1").is_ok());
}

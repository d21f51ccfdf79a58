//! A request's read plan: named queries' policies, the request's overrides, the errors that
//! name their field, and raw SQL switched off.

use super::*;
use ferry_shared::api::CachePolicy;
use serde_json::json;

fn config() -> Config {
    let mut c = Config::default();
    c.auth.allow_raw_sql = true;
    c.queries.insert(
        "item".into(),
        NamedQuery {
            sql: "SELECT $1".into(),
            ttl_s: Some(60),
            tags: vec!["items".into()],
            ..Default::default()
        },
    );
    c
}

#[test]
fn named_queries_bring_their_policy() {
    let p = read(
        &config(),
        QueryRequest {
            query: Some("item".into()),
            params: vec![json!(1)],
            ..Default::default()
        },
        "",
    )
    .expect("valid");
    let cache = p.cache.expect("cached by default");
    assert_eq!(cache.entry.ttl_s, 60);
    assert_eq!(cache.tags, vec!["items".to_string()]);
}

#[test]
fn request_fields_override_and_add() {
    let p = read(
        &config(),
        QueryRequest {
            query: Some("item".into()),
            cache: Some(CachePolicy {
                ttl_s: Some(5),
                tags: vec!["extra".into()],
                ..Default::default()
            }),
            ..Default::default()
        },
        "",
    )
    .expect("valid");
    let cache = p.cache.expect("cache");
    assert_eq!(cache.entry.ttl_s, 5);
    assert_eq!(cache.tags, vec!["extra".to_string(), "items".to_string()]);
}

#[test]
fn mistakes_name_their_field() {
    let c = config();
    let cases = [
        (QueryRequest::default(), "sql"),
        (
            QueryRequest {
                sql: Some("x".into()),
                query: Some("item".into()),
                ..Default::default()
            },
            "sql",
        ),
        (
            QueryRequest {
                query: Some("nope".into()),
                ..Default::default()
            },
            "query",
        ),
        (
            QueryRequest {
                sql: Some("x".into()),
                cache: Some(CachePolicy::default()),
                ..Default::default()
            },
            "cache.ttl_s",
        ),
    ];
    for (req, field) in cases {
        match read(&c, req, "reads[2].") {
            Err(ApiError::InvalidValue { field: f, .. }) => {
                assert_eq!(f, format!("reads[2].{field}"))
            }
            other => panic!("expected invalid {field}, got {other:?}"),
        }
    }
}

#[test]
fn raw_sql_can_be_forbidden() {
    let mut c = config();
    c.auth.allow_raw_sql = false;
    assert!(matches!(
        read(&c, QueryRequest::sql("SELECT 1", vec![]), ""),
        Err(ApiError::RawSqlForbidden)
    ));
    let named = QueryRequest {
        query: Some("item".into()),
        ..Default::default()
    };
    assert!(read(&c, named, "").is_ok());
}

//! What each edge route asks the sidecar: input parsing and the sidecar request bodies.
//! Pure functions, tested natively.

use crate::error::EdgeError;
use ferry_shared::api::{CacheCommand, CachePolicy, ExecuteRequest, Invalidate, QueryRequest};
use serde::Deserialize;
use serde_json::{json, Value};

/// How long an item stays cached, in seconds. Writes invalidate it, so this only bounds how
/// long a change made outside Ferry can go unseen.
pub const ITEM_TTL_S: u64 = 60;
/// Most ids one batch read may ask for.
pub const MAX_BATCH: usize = 100;
/// Default TTL of `PUT /cache/:key`, in seconds.
pub const DEFAULT_CACHE_TTL_S: u64 = 300;

const ITEM_COLUMNS: &str = "id, name, price, tags, updated_at";

/// The cache entry name of one item: what reads cache under and writes invalidate.
pub fn item_key(id: i32) -> String {
    format!("item:{id}")
}

/// A positive item id (items.id is a Postgres integer).
pub fn parse_id(raw: &str) -> Result<i32, EdgeError> {
    raw.parse::<i32>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| EdgeError::invalid("id", format!("{raw:?} is not a positive integer id")))
}

/// `ids=1,2,3` from a query string: 1 to MAX_BATCH ids, duplicates removed, order kept.
pub fn parse_ids(query: Option<&str>) -> Result<Vec<i32>, EdgeError> {
    let raw = query
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("ids="))
        .filter(|v| !v.is_empty())
        .ok_or_else(|| EdgeError::invalid("ids", "give ids=1,2,3"))?;
    let mut ids = Vec::new();
    for part in raw.split(',') {
        let id = parse_id(part).map_err(|_| {
            EdgeError::invalid("ids", format!("{part:?} is not a positive integer id"))
        })?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    if ids.len() > MAX_BATCH {
        return Err(EdgeError::invalid(
            "ids",
            format!("at most {MAX_BATCH} ids per request"),
        ));
    }
    Ok(ids)
}

/// One item, read through the cache under its own key.
pub fn item_query(id: i32) -> QueryRequest {
    QueryRequest {
        sql: format!("SELECT {ITEM_COLUMNS} FROM items WHERE id = $1"),
        params: vec![json!(id)],
        cache: Some(CachePolicy {
            ttl_s: ITEM_TTL_S,
            key: Some(item_key(id)),
        }),
    }
}

/// Many items in one round trip. Not cached as a whole: a batch entry could not be
/// invalidated by a write to one of its items.
pub fn items_query(ids: &[i32]) -> QueryRequest {
    QueryRequest {
        sql: format!("SELECT {ITEM_COLUMNS} FROM items WHERE id = ANY($1)"),
        params: vec![json!(ids)],
        cache: None,
    }
}

/// Rows in the order the ids were asked, and the ids that matched nothing.
pub fn order_items(ids: &[i32], rows: Vec<Value>) -> (Vec<Value>, Vec<i32>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for id in ids {
        match rows.iter().find(|r| r["id"] == json!(id)) {
            Some(r) => found.push(r.clone()),
            None => missing.push(*id),
        }
    }
    (found, missing)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemBody {
    name: String,
    price: Value,
}

/// `PUT /items/:id` with `{"name": "...", "price": "12.50"}`: create or replace the item,
/// then invalidate its cache entry.
pub fn item_upsert(id: i32, body: &[u8]) -> Result<ExecuteRequest, EdgeError> {
    let item: ItemBody = serde_json::from_slice(body).map_err(|e| {
        EdgeError::bad_request(format!(
            "expected {{\"name\": string, \"price\": number or decimal string}}: {e}"
        ))
    })?;
    let name = item.name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(EdgeError::invalid("name", "1 to 200 characters"));
    }
    let price = match &item.price {
        Value::Number(n) => n.to_string(),
        Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
        _ => {
            return Err(EdgeError::invalid(
                "price",
                "a number or a decimal string such as \"12.50\"",
            ))
        }
    };
    Ok(ExecuteRequest {
        sql: "INSERT INTO items (id, name, price) VALUES ($1, $2, $3) \
              ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, price = EXCLUDED.price, \
              updated_at = now()"
            .into(),
        params: vec![json!(id), json!(name), json!(price)],
        invalidate: Some(Invalidate {
            keys: vec![item_key(id)],
        }),
    })
}

/// A plain cache key from the URL path: non-empty, at most 200 bytes, no control characters.
pub fn parse_cache_key(raw: &str) -> Result<String, EdgeError> {
    if raw.is_empty() || raw.len() > 200 || raw.chars().any(char::is_control) {
        return Err(EdgeError::invalid(
            "key",
            "1 to 200 bytes, no control characters",
        ));
    }
    Ok(raw.to_string())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheSetBody {
    value: String,
    #[serde(default)]
    ttl_s: Option<u64>,
}

/// `PUT /cache/:key` with `{"value": "...", "ttl_s": 60}` (ttl_s defaults to 300).
pub fn cache_set(key: String, body: &[u8]) -> Result<CacheCommand, EdgeError> {
    let b: CacheSetBody = serde_json::from_slice(body).map_err(|e| {
        EdgeError::bad_request(format!(
            "expected {{\"value\": string, \"ttl_s\": seconds}}: {e}"
        ))
    })?;
    Ok(CacheCommand::Set {
        key,
        value: b.value,
        ttl_s: Some(b.ttl_s.unwrap_or(DEFAULT_CACHE_TTL_S)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn item_requests() {
        let q = item_query(7);
        assert_eq!(q.params, vec![json!(7)]);
        assert_eq!(q.cache.and_then(|c| c.key).as_deref(), Some("item:7"));
        let q = items_query(&[1, 2]);
        assert!(q.cache.is_none());
        assert_eq!(q.params, vec![json!([1, 2])]);
    }

    #[test]
    fn ordering_keeps_request_order() {
        let rows = vec![json!({"id": 2}), json!({"id": 1})];
        let (found, missing) = order_items(&[1, 9, 2], rows);
        assert_eq!(found, vec![json!({"id": 1}), json!({"id": 2})]);
        assert_eq!(missing, vec![9]);
    }

    #[test]
    fn upserts() {
        let e = item_upsert(3, br#"{"name": " lamp ", "price": "12.50"}"#).expect("valid");
        assert_eq!(e.params, vec![json!(3), json!("lamp"), json!("12.50")]);
        assert_eq!(
            e.invalidate.map(|i| i.keys),
            Some(vec!["item:3".to_string()])
        );
        assert!(item_upsert(3, br#"{"name": "x", "price": 2.5}"#).is_ok());
        for bad in [
            &br#"{"name": "", "price": 1}"#[..],
            br#"{"name": "x"}"#,
            br#"{"name": "x", "price": true}"#,
            br#"{"name": "x", "price": 1, "extra": 1}"#,
            b"not json",
        ] {
            assert!(item_upsert(3, bad).is_err());
        }
    }

    #[test]
    fn cache_bodies() {
        assert_eq!(
            cache_set("k".into(), br#"{"value": "v"}"#),
            Ok(CacheCommand::Set {
                key: "k".into(),
                value: "v".into(),
                ttl_s: Some(DEFAULT_CACHE_TTL_S)
            })
        );
        assert!(cache_set("k".into(), br#"{"value": 1}"#).is_err());
        assert!(parse_cache_key("").is_err());
        assert!(parse_cache_key("a\nb").is_err());
        assert!(parse_cache_key("user:1").is_ok());
    }
}

//! What each edge route asks the sidecar: input parsing and the sidecar request bodies.
//! Pure functions, tested natively.

use ferry_edge::ferry::{Execute, Ferry, Query, Transaction};
use ferry_edge::EdgeError;
use ferry_shared::api::{CacheCommand, Identity};
use serde::Deserialize;
use serde_json::Value;

/// The statements and keyspace the edge uses, all configured on the sidecar
/// (`deploy/ferry.toml`): the edge sends no raw SQL, so it works with `allow_raw_sql = false`.
pub const ITEM_QUERY: &str = "item";
/// The sidecar's named write of one item.
pub const UPSERT_QUERY: &str = "upsert_item";
/// The sidecar's keyspace of items by id.
pub const ITEMS_KEYSPACE: &str = "items";
/// Run as the end user (`identity`): row-level security keeps each user to their own notes.
pub const MY_NOTES_QUERY: &str = "my_notes";
/// The sidecar's named write of a note, owned by the signed-in user.
pub const ADD_NOTE_QUERY: &str = "add_note";
/// Most ids one batch read may ask for.
pub const MAX_BATCH: usize = 100;
/// Default TTL of `PUT /cache/:key`, in seconds.
pub const DEFAULT_CACHE_TTL_S: u64 = 300;
/// Longest TTL `PUT /cache/:key` may set, in seconds (a day): nothing the edge stores lives
/// forever.
pub const MAX_CACHE_TTL_S: u64 = 86_400;
/// Largest value `PUT /cache/:key` may store, in bytes.
pub const MAX_CACHE_VALUE_BYTES: usize = 4_096;
/// The edge's cache routes live in a namespace of their own among the sidecar's plain keys, so
/// they can never touch keys that other callers of the sidecar use.
pub const EDGE_CACHE_NAMESPACE: &str = "edge:";

/// The sidecar key for an edge cache key.
pub fn edge_cache_key(key: &str) -> String {
    format!("{EDGE_CACHE_NAMESPACE}{key}")
}

/// The cache entry name of one item: what reads cache under and writes invalidate. The same
/// name the `items` keyspace uses, so one invalidation reaches single and batch reads (their
/// entries are stored apart: each belongs to its own statement).
pub fn item_key(id: i32) -> String {
    format!("{ITEMS_KEYSPACE}:{id}")
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
    // The cap first, on what was sent (duplicates included), then one pass to parse and drop
    // duplicates: a 60 KB list costs what 100 ids do.
    if raw.split(',').nth(MAX_BATCH).is_some() {
        return Err(EdgeError::invalid(
            "ids",
            format!("at most {MAX_BATCH} ids per request"),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(MAX_BATCH);
    let mut ids = Vec::new();
    for part in raw.split(',') {
        let id = parse_id(part).map_err(|_| {
            EdgeError::invalid("ids", format!("{part:?} is not a positive integer id"))
        })?;
        if seen.insert(id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemBody {
    name: String,
    price: Value,
}

/// An item's checked (name, price); `at` prefixes the field names (`items[2].`) in a list.
fn checked_item(name: &str, price: &Value, at: &str) -> Result<(String, String), EdgeError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(EdgeError::invalid(
            &format!("{at}name"),
            "1 to 200 characters",
        ));
    }
    let text = match price {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.trim().to_string()),
        _ => None,
    };
    // What `numeric(10, 2)` holds, as a plain decimal: no NaN, no infinity, no sign, no
    // exponent, at most two decimals (an out-of-range price used to be stored, then fail the
    // next reprice with a 500).
    let price = text
        .filter(|t| crate::pricing::to_cents(t).is_some_and(|c| c <= crate::pricing::MAX_CENTS))
        .ok_or_else(|| {
            EdgeError::invalid(
                &format!("{at}price"),
                "a price from 0 to 99999999.99, as a number or a decimal string such as \"12.50\"",
            )
        })?;
    Ok((name.to_string(), price))
}

/// `PUT /items/:id` with `{"name": "...", "price": "12.50"}`: create or replace the item,
/// then invalidate its cache entry.
pub fn item_upsert(ferry: &Ferry, id: i32, body: &[u8]) -> Result<Execute, EdgeError> {
    let item: ItemBody = serde_json::from_slice(body).map_err(|e| {
        EdgeError::bad_request(format!(
            "expected {{\"name\": string, \"price\": number or decimal string}}: {e}"
        ))
    })?;
    let (name, price) = checked_item(&item.name, &item.price, "")?;
    Ok(ferry
        .execute(UPSERT_QUERY)
        .bind(id)
        .bind(name)
        .bind(price)
        .invalidate_key(item_key(id)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemsBody {
    items: Vec<ListedItem>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListedItem {
    id: i32,
    name: String,
    price: Value,
}

/// `PUT /items` with `{"items": [{"id": 1, "name": "...", "price": "12.50"}, ...]}`: 1 to
/// [`MAX_BATCH`] items, each id once, written in one transaction (all or none), then each
/// one's cache entry invalidated.
pub fn items_upsert(ferry: &Ferry, body: &[u8]) -> Result<Transaction, EdgeError> {
    let list: ItemsBody = serde_json::from_slice(body).map_err(|e| {
        EdgeError::bad_request(format!(
            "expected {{\"items\": [{{\"id\": integer, \"name\": string, \"price\": \
             number or decimal string}}]}}: {e}"
        ))
    })?;
    if list.items.is_empty() || list.items.len() > MAX_BATCH {
        return Err(EdgeError::invalid(
            "items",
            format!("1 to {MAX_BATCH} items per request"),
        ));
    }
    let mut tx = ferry.transaction();
    let mut seen = Vec::with_capacity(list.items.len());
    for (i, listed) in list.items.iter().enumerate() {
        let at = format!("items[{i}].");
        let id = Some(listed.id)
            .filter(|id| *id > 0)
            .ok_or_else(|| EdgeError::invalid(&format!("{at}id"), "a positive integer id"))?;
        if seen.contains(&id) {
            return Err(EdgeError::invalid(
                &format!("{at}id"),
                format!("item {id} is listed twice"),
            ));
        }
        seen.push(id);
        let (name, price) = checked_item(&listed.name, &listed.price, &at)?;
        let params = [Value::from(id), Value::from(name), Value::from(price)];
        tx = tx
            .statement(UPSERT_QUERY, &params)
            .invalidate_key(item_key(id));
    }
    Ok(tx)
}

/// The tag of one user's notes: a hash of who they are, so any `sub` makes a valid, bounded tag,
/// and their write invalidates only their own cached notes.
pub fn notes_tag(who: &Identity) -> String {
    let sub = who.claims.get("sub").and_then(Value::as_str).unwrap_or("");
    let digest = ferry_shared::sign::body_digest(format!("{}\n{sub}", who.role).as_bytes());
    format!("notes:{}", &digest[..32])
}

/// `GET /me/notes`: the signed-in user's notes (`ferry` runs as them: row-level security
/// decides which rows), cached for them alone.
pub fn my_notes(ferry: &Ferry) -> Query {
    let tag = ferry.identity().map(notes_tag).unwrap_or_default();
    ferry.query(MY_NOTES_QUERY).tag(tag)
}

/// One item, read through the cache under its own key (TTL, stale-while-revalidate and tags
/// come from the sidecar's config for the `item` query).
pub fn item(ferry: &Ferry, id: i32) -> Query {
    ferry.query(ITEM_QUERY).bind(id).key(item_key(id))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoteBody {
    body: String,
}

/// `POST /me/notes` with `{"body": "..."}`: a note owned by the signed-in user (the statement
/// takes the owner from the verified claims), then their cached notes invalidated.
pub fn add_note(ferry: &Ferry, body: &[u8]) -> Result<Execute, EdgeError> {
    let note: NoteBody = serde_json::from_slice(body)
        .map_err(|e| EdgeError::bad_request(format!("expected {{\"body\": string}}: {e}")))?;
    let text = note.body.trim();
    if text.is_empty() || text.chars().count() > 500 {
        return Err(EdgeError::invalid("body", "1 to 500 characters"));
    }
    let tag = ferry.identity().map(notes_tag).unwrap_or_default();
    Ok(ferry.execute(ADD_NOTE_QUERY).bind(text).invalidate_tag(tag))
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

/// `PUT /cache/:key` with `{"value": "...", "ttl_s": 60}` (ttl_s defaults to 300): at most
/// MAX_CACHE_VALUE_BYTES, for 1 to MAX_CACHE_TTL_S seconds, in the edge's namespace.
pub fn cache_set(key: &str, body: &[u8]) -> Result<CacheCommand, EdgeError> {
    let b: CacheSetBody = serde_json::from_slice(body).map_err(|e| {
        EdgeError::bad_request(format!(
            "expected {{\"value\": string, \"ttl_s\": seconds}}: {e}"
        ))
    })?;
    if b.value.len() > MAX_CACHE_VALUE_BYTES {
        return Err(EdgeError::invalid(
            "value",
            format!("at most {MAX_CACHE_VALUE_BYTES} bytes"),
        ));
    }
    let ttl_s = b.ttl_s.unwrap_or(DEFAULT_CACHE_TTL_S);
    if !(1..=MAX_CACHE_TTL_S).contains(&ttl_s) {
        return Err(EdgeError::invalid(
            "ttl_s",
            format!("1 to {MAX_CACHE_TTL_S} seconds"),
        ));
    }
    Ok(CacheCommand::Set {
        key: edge_cache_key(key),
        value: b.value,
        ttl_s: Some(ttl_s),
    })
}

#[cfg(test)]
#[path = "requests_tests.rs"]
mod tests;

//! Replies as Upstash shapes them in JSON: bulk strings as strings, and status replies too
//! (`PONG`, `string` from TYPE), integers as numbers, nil as null, arrays as arrays. With
//! `Upstash-Encoding: base64` (the clients' default) every string is base64 at every depth,
//! status replies included, except `OK`: the clients decode each one, and Upstash leaves only
//! `OK` as it is.

use super::wire::Reply;
use base64::Engine as _;
use serde_json::Value;

pub(crate) fn to_json(v: &Reply, base64: bool) -> Value {
    let text = |b: &[u8]| {
        if base64 {
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        } else {
            Value::String(String::from_utf8_lossy(b).into_owned())
        }
    };
    match v {
        Reply::Nil => Value::Null,
        Reply::Int(i) => Value::from(*i),
        Reply::Bulk(b) => text(b),
        Reply::Status(s) if s == "OK" => Value::String(s.clone()),
        Reply::Status(s) => text(s.as_bytes()),
        Reply::Error(e) => Value::String(e.clone()),
        Reply::Array(items) => Value::Array(items.iter().map(|i| to_json(i, base64)).collect()),
    }
}

/// A reply the redis crate read (the cluster path), as the door's own.
pub(crate) fn from_redis(v: &redis::Value) -> Reply {
    match v {
        redis::Value::Nil => Reply::Nil,
        redis::Value::Int(i) => Reply::Int(*i),
        redis::Value::BulkString(b) => Reply::Bulk(b.clone()),
        redis::Value::SimpleString(s) => Reply::Status(s.clone()),
        redis::Value::Okay => Reply::Status("OK".into()),
        redis::Value::Double(d) => Reply::Bulk(d.to_string().into_bytes()),
        redis::Value::Boolean(b) => Reply::Int(i64::from(*b)),
        redis::Value::VerbatimString { text, .. } => Reply::Bulk(text.clone().into_bytes()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            Reply::Array(items.iter().map(from_redis).collect())
        }
        redis::Value::Map(pairs) => Reply::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [from_redis(k), from_redis(v)])
                .collect(),
        ),
        redis::Value::Attribute { data, .. } => from_redis(data),
        redis::Value::Push { data, .. } => Reply::Array(data.iter().map(from_redis).collect()),
        redis::Value::ServerError(e) => Reply::Error(match e.details() {
            Some(d) => format!("{} {d}", e.code()),
            None => e.code().to_string(),
        }),
        _ => Reply::Nil,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_reaches_nested_strings_and_status_replies_but_spares_numbers_and_ok() {
        let v = Reply::Array(vec![
            Reply::Bulk(b"hi".to_vec()),
            Reply::Array(vec![Reply::Bulk(b"x".to_vec()), Reply::Int(3)]),
            Reply::Nil,
            Reply::Status("OK".into()),
            Reply::Status("PONG".into()),
        ]);
        assert_eq!(
            to_json(&v, true),
            serde_json::json!(["aGk=", ["eA==", 3], null, "OK", "UE9ORw=="])
        );
        assert_eq!(
            to_json(&v, false),
            serde_json::json!(["hi", ["x", 3], null, "OK", "PONG"])
        );
    }
}

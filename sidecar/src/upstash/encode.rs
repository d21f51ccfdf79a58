//! Redis replies as Upstash shapes them in JSON: bulk strings as strings (base64 when the
//! caller sends `Upstash-Encoding: base64`, at every depth), integers as numbers, nil as null,
//! arrays as arrays, status replies ("OK") as they are.

use base64::Engine as _;
use serde_json::Value;

pub fn to_json(v: &redis::Value, base64: bool) -> Value {
    let text = |b: &[u8]| {
        if base64 {
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        } else {
            Value::String(String::from_utf8_lossy(b).into_owned())
        }
    };
    match v {
        redis::Value::Nil => Value::Null,
        redis::Value::Int(i) => Value::from(*i),
        redis::Value::BulkString(b) => text(b),
        redis::Value::SimpleString(s) => Value::String(s.clone()),
        redis::Value::Okay => Value::String("OK".into()),
        redis::Value::Double(d) => Value::from(*d),
        redis::Value::Boolean(b) => Value::from(i64::from(*b)),
        redis::Value::VerbatimString { text: t, .. } => Value::String(t.clone()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            Value::Array(items.iter().map(|i| to_json(i, base64)).collect())
        }
        redis::Value::Map(pairs) => Value::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [to_json(k, base64), to_json(v, base64)])
                .collect(),
        ),
        redis::Value::Attribute { data, .. } => to_json(data, base64),
        redis::Value::Push { data, .. } => {
            Value::Array(data.iter().map(|i| to_json(i, base64)).collect())
        }
        redis::Value::ServerError(e) => Value::String(e.to_string()),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value as V;

    #[test]
    fn base64_reaches_nested_strings_and_spares_numbers_and_ok() {
        let v = V::Array(vec![
            V::BulkString(b"hi".to_vec()),
            V::Array(vec![V::BulkString(b"x".to_vec()), V::Int(3)]),
            V::Nil,
            V::Okay,
        ]);
        assert_eq!(
            to_json(&v, true),
            serde_json::json!(["aGk=", ["eA==", 3], null, "OK"])
        );
        assert_eq!(
            to_json(&v, false),
            serde_json::json!(["hi", ["x", 3], null, "OK"])
        );
    }
}

//! A read's rows on their way to the response: as Postgres gave them, or as the JSON text a
//! cache entry holds. A hit's rows are copied from Redis's reply into the response as text:
//! decoding them into maps and encoding them again was most of a hit's lookup (8% of an
//! inferred sidecar's CPU in the blog mix, perf). The text is what `serde_json` wrote when the
//! entry was filled from the same rows, so the response is byte for byte what it was.

use ferry_shared::api::Row;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

#[derive(Debug, Clone)]
pub(crate) enum Rows {
    /// From Postgres (or decoded where a caller needs the values).
    Parsed(Vec<Row>),
    /// A JSON array of row objects, as a cache entry stores it (checked to be an array when
    /// the entry was read).
    Text(Box<RawValue>),
}

impl Rows {
    /// The rows as values: decoded when they are text. An entry's text that is not an array
    /// of objects (never written by Ferry) is an error, not a guess.
    pub(crate) fn into_parsed(self) -> Result<Vec<Row>, serde_json::Error> {
        match self {
            Rows::Parsed(rows) => Ok(rows),
            Rows::Text(text) => serde_json::from_str(text.get()),
        }
    }

    /// About how many bytes the rows take as JSON: what batch budgets count.
    pub(crate) fn approx_bytes(&self) -> usize {
        match self {
            Rows::Parsed(rows) => approx_bytes(rows),
            Rows::Text(text) => text.get().len(),
        }
    }
}

impl From<Vec<Row>> for Rows {
    fn from(rows: Vec<Row>) -> Rows {
        Rows::Parsed(rows)
    }
}

impl Serialize for Rows {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rows::Parsed(rows) => rows.serialize(s),
            Rows::Text(text) => text.serialize(s),
        }
    }
}

/// About how many bytes `rows` take as JSON.
fn approx_bytes(rows: &[Row]) -> usize {
    use serde_json::Value;
    fn value(v: &Value) -> usize {
        match v {
            Value::String(s) => s.len() + 2,
            Value::Array(a) => a.iter().map(value).sum::<usize>() + 2,
            Value::Object(o) => o.iter().map(|(k, v)| k.len() + 3 + value(v)).sum::<usize>() + 2,
            _ => 8,
        }
    }
    rows.iter()
        .map(|r| r.iter().map(|(k, v)| k.len() + 3 + value(v)).sum::<usize>() + 2)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows() -> Vec<Row> {
        let v = json!([
            {"id": 1, "title": "a \"quoted\" title\n", "score": 0.1, "tags": ["x", null]},
            {"id": 2, "title": "ünïcode ☃", "score": 1e300, "tags": []}
        ]);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn text_is_answered_as_the_parsed_rows_would_be() {
        let parsed = Rows::Parsed(rows());
        let stored = serde_json::to_string(&rows()).unwrap();
        let text = Rows::Text(RawValue::from_string(stored).unwrap());
        assert_eq!(
            serde_json::to_string(&parsed).unwrap(),
            serde_json::to_string(&text).unwrap()
        );
        assert_eq!(text.clone().into_parsed().unwrap(), rows());
        let n = serde_json::to_string(&rows()).unwrap().len();
        assert_eq!(text.approx_bytes(), n);
    }

    #[test]
    fn text_that_is_not_rows_is_an_error() {
        let text = Rows::Text(RawValue::from_string("[1, 2]".into()).unwrap());
        assert!(text.into_parsed().is_err());
    }
}

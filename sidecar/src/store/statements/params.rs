//! JSON parameters to Postgres parameters.
//!
//! Each parameter is sent in Postgres' *text* format for the type Postgres inferred for it, so
//! Postgres itself parses it with its own rules (`"42"` into int4, `"2024-01-02"` into date,
//! `{1,2}` into int4[]): every type Postgres can read from text works, and a value it cannot read
//! is refused by Postgres with a precise SQLSTATE (e.g. 22P02), answered as 400.
//!
//! JSON to text: null is SQL NULL; bool, number and string as written; an array becomes an
//! array literal; json/jsonb parameters take any JSON value as JSON text; bytea parameters take
//! base64 (the same encoding results use).

use base64::Engine;
use bytes::BytesMut;
use postgres_types::{to_sql_checked, Format, IsNull, Kind, ToSql, Type};
use serde_json::Value;

/// One parameter, already rendered in Postgres text format (`None` is NULL).
#[derive(Debug)]
pub(crate) struct TextParam(pub Option<String>);

impl ToSql for TextParam {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.0 {
            None => Ok(IsNull::Yes),
            Some(s) => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

/// Renders `value` as Postgres text for a parameter of type `ty`. The error says what is wrong
/// with the value (the caller prefixes which parameter).
pub(crate) fn to_text(value: &Value, ty: &Type) -> Result<TextParam, String> {
    if value.is_null() {
        return Ok(TextParam(None));
    }
    let base = base_type(ty);
    if matches!(*base, Type::JSON | Type::JSONB) {
        return Ok(TextParam(Some(value.to_string())));
    }
    match (value, base.kind()) {
        (Value::Array(items), Kind::Array(member)) => {
            Ok(TextParam(Some(array_literal(items, member)?)))
        }
        (Value::Array(_), _) => Err(format!("an array was given for type {}", ty.name())),
        (Value::Object(_), _) => Err(format!(
            "an object was given for type {} (objects bind only to json/jsonb)",
            ty.name()
        )),
        (scalar, _) => Ok(TextParam(Some(scalar_text(scalar, base)?))),
    }
}

fn base_type(ty: &Type) -> &Type {
    match ty.kind() {
        Kind::Domain(base) => base_type(base),
        _ => ty,
    }
}

fn scalar_text(value: &Value, ty: &Type) -> Result<String, String> {
    match value {
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::String(s) if *ty == Type::BYTEA => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|_| "bytea values must be base64".to_string())?;
            Ok(format!("\\x{}", hex::encode(bytes)))
        }
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok("NULL".into()),
        Value::Array(_) | Value::Object(_) => Err("nested value where a scalar belongs".into()),
    }
}

/// `[1, null, "a\"b"]` into `{"1",NULL,"a\"b"}`: every element quoted, so commas, braces and
/// spaces inside strings are data, never syntax.
/// One element of an array literal, double-quoted with `"` and `\\` escaped.
pub(crate) fn push_element(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

fn array_literal(items: &[Value], member: &Type) -> Result<String, String> {
    let member = base_type(member);
    let mut out = String::from("{");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match item {
            Value::Null => out.push_str("NULL"),
            Value::Array(inner) if !matches!(*member, Type::JSON | Type::JSONB) => {
                out.push_str(&array_literal(inner, member)?)
            }
            other => {
                let text = if matches!(*member, Type::JSON | Type::JSONB) {
                    other.to_string()
                } else {
                    scalar_text(other, member)?
                };
                push_element(&mut out, &text);
            }
        }
    }
    out.push('}');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(v: Value, ty: &Type) -> Option<String> {
        to_text(&v, ty).expect("renders").0
    }

    #[test]
    fn scalars() {
        assert_eq!(text(json!(null), &Type::INT4), None);
        assert_eq!(text(json!(42), &Type::INT4).as_deref(), Some("42"));
        assert_eq!(text(json!(true), &Type::BOOL).as_deref(), Some("true"));
        assert_eq!(text(json!("x"), &Type::TEXT).as_deref(), Some("x"));
        assert_eq!(
            text(json!("AAE="), &Type::BYTEA).as_deref(),
            Some("\\x0001")
        );
        assert_eq!(
            text(json!({"a": [1]}), &Type::JSONB).as_deref(),
            Some(r#"{"a":[1]}"#)
        );
    }

    #[test]
    fn arrays_are_quoted_literals() {
        assert_eq!(
            text(json!([1, null, 3]), &Type::INT4_ARRAY).as_deref(),
            Some(r#"{"1",NULL,"3"}"#)
        );
        assert_eq!(
            text(json!(["a,b", "q\"uote", "back\\slash"]), &Type::TEXT_ARRAY).as_deref(),
            Some(r#"{"a,b","q\"uote","back\\slash"}"#)
        );
        assert_eq!(
            text(json!([[1, 2], [3, 4]]), &Type::INT4_ARRAY).as_deref(),
            Some(r#"{{"1","2"},{"3","4"}}"#)
        );
    }

    #[test]
    fn wrong_shapes_are_refused() {
        assert!(to_text(&json!([1]), &Type::INT4).is_err());
        assert!(to_text(&json!({"a": 1}), &Type::TEXT).is_err());
        assert!(to_text(&json!("not base64!"), &Type::BYTEA).is_err());
    }
}

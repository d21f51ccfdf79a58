//! Request body decoding with errors that name the offending field.

use crate::error::ApiError;
use serde::de::DeserializeOwned;

/// Parses a JSON body into `T`. Errors say what is wrong and where (`cache.ttl_s`), never
/// echoing the body back.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "the body is empty; a JSON object is expected",
        ));
    }
    // The plain parse first: tracking the path costs on every field, and only a refused body
    // needs it, so that one is parsed again to name where it went wrong.
    if let Ok(t) = serde_json::from_slice(body) {
        return Ok(t);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let t = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != ".").then_some(path);
        refusal(e.into_inner(), field)
    })?;
    // What the plain parse refused may be a well-formed value with bytes after it
    // (`{...} junk`): `end` refuses those, as `from_slice` does.
    de.end().map_err(|e| refusal(e, None))?;
    Ok(t)
}

fn refusal(inner: serde_json::Error, field: Option<String>) -> ApiError {
    let message = match (&field, inner.classify()) {
        (_, serde_json::error::Category::Syntax | serde_json::error::Category::Eof) => {
            format!("the body is not valid JSON ({inner})")
        }
        (Some(f), _) => format!("{f}: {inner}"),
        (None, _) => inner.to_string(),
    };
    ApiError::BadRequest { message, field }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_shared::api::QueryRequest;

    #[test]
    fn errors_name_the_field() {
        let e = parse::<QueryRequest>(br#"{"sql": "x", "cache": {"ttl_s": "sixty"}}"#)
            .expect_err("wrong type");
        match e {
            ApiError::BadRequest { field, .. } => assert_eq!(field.as_deref(), Some("cache.ttl_s")),
            other => panic!("unexpected {other:?}"),
        }
        assert!(parse::<QueryRequest>(b"{not json").is_err());
        assert!(parse::<QueryRequest>(b"").is_err());
        assert!(parse::<QueryRequest>(br#"{"sql": "x"} junk"#).is_err());
        assert!(parse::<QueryRequest>(br#"{"sql": "x"}  "#).is_ok());
        assert!(parse::<QueryRequest>(br#"{"sql": "x", "extra": 1}"#).is_err());
    }
}

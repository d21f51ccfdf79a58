//! Values that must never be printed: a config in a log line or a panic message carries
//! neither the secrets nor the passwords inside URLs. Both serialize as the plain value.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Deref;

/// A secret: read and written as the plain value, printed as `<redacted>`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Redacted<T>(pub T);

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<T> Deref for Redacted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl From<&str> for Redacted<String> {
    fn from(s: &str) -> Self {
        Redacted(s.to_string())
    }
}

impl From<String> for Redacted<String> {
    fn from(s: String) -> Self {
        Redacted(s)
    }
}

/// A connection URL that may hold a password: printed with the password hidden.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RedactedUrl(pub String);

impl RedactedUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

impl Deref for RedactedUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for RedactedUrl {
    fn from(s: &str) -> Self {
        RedactedUrl(s.to_string())
    }
}

impl From<String> for RedactedUrl {
    fn from(s: String) -> Self {
        RedactedUrl(s)
    }
}

/// `scheme://user:password@host` with the password hidden.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:<redacted>{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_url_passwords_never_print() {
        assert_eq!(format!("{:?}", Redacted::from("hunter2")), "<redacted>");
        let url = |u: &str| format!("{:?}", RedactedUrl::from(u));
        assert_eq!(
            url("postgres://app:s3cret@db:5432/app"),
            "\"postgres://app:<redacted>@db:5432/app\""
        );
        assert_eq!(url("redis://:pw@r:6379"), "\"redis://:<redacted>@r:6379\"");
        assert_eq!(url("redis://r:6379"), "\"redis://r:6379\"");
    }

    #[test]
    fn they_serialize_as_plain_values() {
        let v = serde_json::to_value(Redacted::from("x")).expect("serializes");
        assert_eq!(v, serde_json::json!("x"));
        let u: RedactedUrl = serde_json::from_str("\"redis://h\"").expect("parses");
        assert_eq!(u.as_str(), "redis://h");
    }
}

//! The protocol doors as their real clients knock: Neon's SQL over HTTP (`POST /sql`, the
//! token as the connection string's password) and Upstash's Redis REST (a bearer token).
//! Unsigned: these doors take their own credentials, not Ferry's signature.

use crate::client::{Answer, Client};
use serde_json::Value;

impl Client {
    /// `POST /sql` as `@neondatabase/serverless` sends it, with `token` as the password.
    pub fn neon(&self, token: &str, body: Value, headers: &[(&str, &str)]) -> Answer {
        self.block_on(self.neon_async(token, body, headers))
    }

    pub async fn neon_async(&self, token: &str, body: Value, headers: &[(&str, &str)]) -> Answer {
        let mut all = vec![
            (
                "neon-connection-string",
                format!("postgresql://app:{token}@db.ferry.invalid/app"),
            ),
            ("neon-raw-text-output", "true".to_string()),
        ];
        all.extend(headers.iter().map(|(k, v)| (*k, v.to_string())));
        self.send_raw("POST", "/sql", body.to_string().into_bytes(), &all)
            .await
    }

    /// An Upstash REST call (`path`: `/`, `/pipeline`, `/multi-exec`) with `token` as bearer.
    pub fn upstash(&self, token: &str, path: &str, body: Value) -> Answer {
        self.block_on(self.upstash_async(token, path, body))
    }

    pub async fn upstash_async(&self, token: &str, path: &str, body: Value) -> Answer {
        let auth = [("authorization", format!("Bearer {token}"))];
        self.send_raw("POST", path, body.to_string().into_bytes(), &auth)
            .await
    }
}

/// A config file for a test's sidecar (`FERRY_CONFIG`), removed when dropped.
pub fn config_file(toml: &str) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("a temp config file");
    f.write_all(toml.as_bytes()).expect("write the config");
    f
}

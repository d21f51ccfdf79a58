//! Loading: the TOML file (every key optional), then `FERRY_SECTION_KEY` overrides and the
//! four short aliases, then secrets from files (and the Upstash tokens from
//! `FERRY_UPSTASH_TOKEN` / `FERRY_UPSTASH_READ_ONLY_TOKEN`), then validation.

use super::{Config, Redacted};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A configuration problem, naming the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("environment variable {var} (key {key}): {message}")]
    Env {
        var: String,
        key: String,
        message: String,
    },
    #[error("key {key}: {message}")]
    Invalid { key: String, message: String },
}

/// Short aliases, checked after the generic `FERRY_SECTION_KEY` names.
const ALIASES: &[(&str, &str, &str)] = &[
    ("FERRY_LISTEN", "server", "listen"),
    ("FERRY_REDIS_URL", "redis", "url"),
    ("FERRY_DATABASE_URL", "postgres", "url"),
    ("FERRY_SECRET", "auth", "secret"),
];

impl Config {
    /// Reads the file (if any), applies overrides from `env`, and validates.
    pub fn load(
        path: Option<&Path>,
        env: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let mut table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                toml::from_str::<toml::Table>(&text).map_err(|e| ConfigError::Parse {
                    path: p.display().to_string(),
                    message: e.to_string(),
                })?
            }
            None => toml::Table::new(),
        };
        apply_env(&mut table, env)?;
        let mut config: Config =
            Config::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Parse {
                path: path.map_or("(environment)".into(), |p| p.display().to_string()),
                message: e.to_string(),
            })?;
        config.resolve_files()?;
        // One token each without a file (containers, the dev command): namespace "default:", or
        // FERRY_UPSTASH_TOKEN_PREFIX ("": the token owns the door's whole database); scripts as
        // FERRY_UPSTASH_TOKEN_SCRIPT_USER with FERRY_UPSTASH_TOKEN_SCRIPT_PASSWORD.
        let prefix = env
            .get("FERRY_UPSTASH_TOKEN_PREFIX")
            .cloned()
            .unwrap_or_else(|| "default:".into());
        for (var, read_only) in [
            ("FERRY_UPSTASH_TOKEN", false),
            ("FERRY_UPSTASH_READ_ONLY_TOKEN", true),
        ] {
            if let Some(token) = env.get(var) {
                config.upstash.tokens.push(super::UpstashToken {
                    token: Redacted(token.clone()),
                    prefix: prefix.clone(),
                    read_only,
                    script_user: env
                        .get("FERRY_UPSTASH_TOKEN_SCRIPT_USER")
                        .cloned()
                        .unwrap_or_default(),
                    script_password: Redacted(
                        env.get("FERRY_UPSTASH_TOKEN_SCRIPT_PASSWORD")
                            .cloned()
                            .unwrap_or_default(),
                    ),
                });
            }
        }
        if let Some(token) = env.get("FERRY_NEON_TOKEN") {
            config.neon.tokens.push(super::NeonToken {
                token: Redacted(token.clone()),
                read_only: false,
                // FERRY_NEON_POSTGRES_URL: its role (empty: postgres.url's, with single_role).
                postgres_url: env
                    .get("FERRY_NEON_POSTGRES_URL")
                    .cloned()
                    .unwrap_or_default()
                    .into(),
                sessions_per_worker: 1,
                // FERRY_NEON_CACHE_TTL_S: cache every single read it sends (seconds).
                cache_ttl_s: match env.get("FERRY_NEON_CACHE_TTL_S") {
                    Some(v) => Some(v.trim().parse().map_err(|_| ConfigError::Invalid {
                        key: "FERRY_NEON_CACHE_TTL_S".into(),
                        message: "a whole number of seconds".into(),
                    })?),
                    None => None,
                },
            });
        }
        config.validate()?;
        Ok(config)
    }

    /// Replaces `*_file` settings by the contents of the files they name.
    fn resolve_files(&mut self) -> Result<(), ConfigError> {
        let read = |key: &str, path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
                .map_err(|e| ConfigError::Invalid {
                    key: key.into(),
                    message: format!("cannot read {path}: {e}"),
                })
        };
        if !self.auth.secret_file.is_empty() {
            self.auth.secret = Redacted(read("auth.secret_file", &self.auth.secret_file)?);
        }
        if !self.identity.jwt_secret_file.is_empty() {
            self.identity.jwt_secret = Redacted(read(
                "identity.jwt_secret_file",
                &self.identity.jwt_secret_file,
            )?);
        }
        if !self.postgres.password_file.is_empty() {
            self.postgres.password = Some(Redacted(read(
                "postgres.password_file",
                &self.postgres.password_file,
            )?));
        }
        Ok(())
    }
}

/// Overrides keys of `table` from `FERRY_SECTION_KEY` variables. Known keys come from the
/// defaults, so a variable is parsed as the type its key has (number, bool or string).
fn apply_env(table: &mut toml::Table, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    let defaults = toml::Table::try_from(Config::default()).map_err(|e| ConfigError::Invalid {
        key: "(defaults)".into(),
        message: e.to_string(),
    })?;
    let mut overrides: Vec<(String, String, String, String)> = Vec::new();
    for (section, keys) in &defaults {
        let Some(keys) = keys.as_table() else {
            continue;
        };
        for key in keys.keys() {
            let var = format!("FERRY_{}_{}", section, key).to_ascii_uppercase();
            if let Some(v) = env.get(&var) {
                overrides.push((var, section.clone(), key.clone(), v.clone()));
            }
        }
    }
    for (var, section, key) in ALIASES {
        if let Some(v) = env.get(*var) {
            overrides.push((
                var.to_string(),
                section.to_string(),
                key.to_string(),
                v.clone(),
            ));
        }
    }
    for (var, section, key, raw) in overrides {
        let default = &defaults[&section][&key];
        let value = match default {
            toml::Value::Integer(_) => raw
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    key: format!("{section}.{key}"),
                    message: format!("expected a whole number, got {raw:?}"),
                })?,
            toml::Value::Boolean(_) => raw
                .trim()
                .parse::<bool>()
                .map(toml::Value::Boolean)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    key: format!("{section}.{key}"),
                    message: format!("expected true or false, got {raw:?}"),
                })?,
            // Lists (changes.tables) as comma-separated values.
            toml::Value::Array(_) => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(|v| toml::Value::String(v.to_string()))
                    .collect(),
            ),
            _ => toml::Value::String(raw),
        };
        let section_table = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match section_table.as_table_mut() {
            Some(t) => {
                t.insert(key, value);
            }
            None => {
                return Err(ConfigError::Invalid {
                    key: section,
                    message: "must be a table".into(),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RedisConfig;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const SECRET: (&str, &str) = ("FERRY_SECRET", "0123456789abcdef0123");

    #[test]
    fn runs_from_environment_alone() {
        let c = Config::load(
            None,
            &env(&[
                SECRET,
                ("FERRY_LISTEN", "0.0.0.0:9000"),
                ("FERRY_REDIS_URL", "redis://127.0.0.1:7000"),
                ("FERRY_DATABASE_URL", "postgres://u@127.0.0.1:7001/db"),
                (
                    "FERRY_POSTGRES_OWNER_URL",
                    "postgres://owner@127.0.0.1:7001/db",
                ),
                ("FERRY_POSTGRES_POOL_SIZE", "3"),
            ]),
        )
        .expect("valid");
        assert_eq!(c.server.listen, "0.0.0.0:9000");
        assert_eq!(c.redis.url.as_str(), "redis://127.0.0.1:7000");
        assert_eq!(c.postgres.pool_size, 3);
    }

    #[test]
    fn books_without_a_role_of_their_own_are_refused_unless_one_role_is_chosen() {
        let db = ("FERRY_DATABASE_URL", "postgres://u@127.0.0.1:7001/db");
        let e = Config::load(None, &env(&[SECRET, db])).expect_err("no owner_url");
        assert!(e.to_string().contains("postgres.owner_url"), "{e}");
        let one = ("FERRY_POSTGRES_SINGLE_ROLE", "true");
        assert!(Config::load(None, &env(&[SECRET, db, one])).is_ok());
        // No books in Postgres, nothing to keep apart.
        let none = [
            SECRET,
            db,
            ("FERRY_AUTH_REPLAY", "local"),
            ("FERRY_CACHE_DEFERRED_TABLE", ""),
        ];
        assert!(Config::load(None, &env(&none)).is_ok());
    }

    #[test]
    fn bad_values_name_their_key() {
        let e = Config::load(None, &env(&[SECRET, ("FERRY_REDIS_POOL_SIZE", "many")]))
            .expect_err("invalid");
        assert!(e.to_string().contains("redis.pool_size"), "{e}");
        let e = Config::load(None, &env(&[SECRET, ("FERRY_REDIS_POOL_SIZE", "0")]))
            .expect_err("invalid");
        assert!(e.to_string().contains("redis.pool_size"), "{e}");
        let e = Config::load(None, &env(&[])).expect_err("no secret");
        assert!(e.to_string().contains("auth.secret"), "{e}");
    }

    #[test]
    fn a_default_ttl_without_the_change_stream_is_refused() {
        let default = ("FERRY_CACHE_DEFAULT_TTL_S", "60");
        let one = ("FERRY_POSTGRES_SINGLE_ROLE", "true");
        let e = Config::load(None, &env(&[SECRET, one, default])).expect_err("no stream");
        assert!(e.to_string().contains("cache.default_ttl_s"), "{e}");
        let on = ("FERRY_CHANGES_ENABLED", "true");
        let watched = ("FERRY_CHANGES_TABLES", "items");
        let c = Config::load(None, &env(&[SECRET, one, default, on, watched]))
            .expect("with the stream");
        assert_eq!(c.cache.default_ttl_s, 60);
        let token = ("FERRY_NEON_TOKEN", "t-0123456789abcdef0123456789abcdef");
        let ttl = ("FERRY_NEON_CACHE_TTL_S", "60");
        let e = Config::load(
            None,
            &env(&[SECRET, token, ttl, ("FERRY_POSTGRES_SINGLE_ROLE", "true")]),
        )
        .expect_err("a token's TTL without the stream");
        assert!(e.to_string().contains("cache_ttl_s"), "{e}");
    }

    #[test]
    fn an_immutable_function_is_named_with_its_schema_and_arguments() {
        let one = ("FERRY_POSTGRES_SINGLE_ROLE", "true");
        let bare = ("FERRY_CACHE_IMMUTABLE_FUNCTIONS", "shout");
        let e = Config::load(None, &env(&[SECRET, one, bare])).expect_err("bare name");
        assert!(
            e.to_string().contains("cache.immutable_functions[0]"),
            "{e}"
        );
        let named = ("FERRY_CACHE_IMMUTABLE_FUNCTIONS", "public.shout(text)");
        let c = Config::load(None, &env(&[SECRET, one, named])).expect("named");
        assert_eq!(c.cache.immutable_functions, vec!["public.shout(text)"]);
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "[redis]\npool_sise = 3\n").expect("write");
        let e = Config::load(Some(&path), &env(&[SECRET])).expect_err("unknown key");
        assert!(e.to_string().contains("pool_sise"), "{e}");
    }

    #[test]
    fn secrets_can_come_from_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        let password = dir.path().join("pgpass");
        std::fs::write(&secret, "file-secret-0123456789\n").expect("write");
        std::fs::write(&password, "hunter2\n").expect("write");
        let c = Config::load(
            None,
            &env(&[
                (
                    "FERRY_AUTH_SECRET_FILE",
                    secret.to_str().expect("utf-8 path"),
                ),
                (
                    "FERRY_POSTGRES_PASSWORD_FILE",
                    password.to_str().expect("utf-8 path"),
                ),
                ("FERRY_POSTGRES_SINGLE_ROLE", "true"),
            ]),
        )
        .expect("valid");
        assert_eq!(c.auth.secret.as_str(), "file-secret-0123456789");
        assert_eq!(
            c.postgres.password.as_ref().map(|p| p.as_str()),
            Some("hunter2")
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("file-secret") && !debug.contains("hunter2"),
            "{debug}"
        );
        let e = Config::load(None, &env(&[("FERRY_AUTH_SECRET_FILE", "/nonexistent/x")]))
            .expect_err("missing file");
        assert!(e.to_string().contains("auth.secret_file"), "{e}");
    }

    #[test]
    fn tls_needs_both_files_that_load() {
        let e = Config::load(
            None,
            &env(&[
                SECRET,
                ("FERRY_SERVER_TLS_CERT_PATH", "/nonexistent/cert.pem"),
            ]),
        )
        .expect_err("half a TLS config");
        assert!(e.to_string().contains("server.tls_cert_path"), "{e}");
        let e = Config::load(
            None,
            &env(&[
                SECRET,
                ("FERRY_SERVER_TLS_CERT_PATH", "/nonexistent/cert.pem"),
                ("FERRY_SERVER_TLS_KEY_PATH", "/nonexistent/key.pem"),
            ]),
        )
        .expect_err("missing files");
        assert!(e.to_string().contains("/nonexistent/cert.pem"), "{e}");
    }

    #[test]
    fn sample_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ferry.toml");
        let c = Config::load(Some(&path), &env(&[SECRET])).expect("sample config is valid");
        assert_eq!(c.redis.pool_size, RedisConfig::default().pool_size);
    }
}

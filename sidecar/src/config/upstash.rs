//! `[upstash]`: the Upstash-compatible Redis REST endpoints, and the bearer tokens they accept.

use super::{Config, ConfigError, Redacted, RedactedUrl};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstashConfig {
    /// Serve `POST /`, `/pipeline` and `/multi-exec` as Upstash's Redis REST API does, so
    /// `@upstash/redis` and `upstash-redis` work by changing their URL and token.
    pub enabled: bool,
    /// The door's own Redis (`redis://` / `rediss://`, `redis.tls_ca_path` applies). Empty: the
    /// cache's (`redis.url`), where scripts and whole-database tokens are refused: a script can
    /// stop the Redis it runs on, and Ferry's cache, replay checks and rate limits live there.
    pub redis_url: RedactedUrl,
    /// Connections the door keeps to its Redis, all tokens together (on top of
    /// `redis.pool_size` when it is the cache's Redis). A request holds one for its round trip
    /// only: 32 keep 32 concurrent callers from waiting (4 held the door to 0.49x webdis).
    pub pool_size: usize,
    /// No `redis_url`: the door runs on the cache's Redis. Unsafe, and so opt-in: a token's
    /// commands can then slow that Redis (LCS-like work, big replies), fill it (and, with an
    /// eviction policy, evict Ferry's entries and replay records) and stop Ferry's cache.
    pub share_cache_redis: bool,
    /// The tokens callers send as `Authorization: Bearer <token>`: `[[upstash.tokens]]`.
    pub tokens: Vec<UpstashToken>,
}

impl Default for UpstashConfig {
    fn default() -> Self {
        UpstashConfig {
            enabled: false,
            redis_url: RedactedUrl::default(),
            pool_size: 32,
            share_cache_redis: false,
            tokens: Vec::new(),
        }
    }
}

impl UpstashConfig {
    /// Whether the door has a Redis of its own (`redis_url`).
    pub fn own_redis(&self) -> bool {
        !self.redis_url.is_empty()
    }

    /// Where a token's keys live: under its prefix alone on the door's own Redis; under
    /// `cache.key_prefix` + `u:` + its prefix on the cache's.
    pub fn namespace(&self, cache_prefix: &str, token: &UpstashToken) -> String {
        if self.own_redis() {
            token.prefix.clone()
        } else {
            format!("{cache_prefix}u:{}", token.prefix)
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstashToken {
    /// At least 32 characters of randomness (the token is the whole credential).
    pub token: Redacted<String>,
    /// The namespace: every key this token names is stored under it in Redis (after
    /// `cache.key_prefix` + `u:` on the cache's Redis), so tokens never see each other's keys.
    /// Empty: the token owns the whole database, as an Upstash database's own token does
    /// (only on the door's own Redis, `upstash.redis_url`).
    pub prefix: String,
    /// Refuse commands that write (Upstash's read-only tokens).
    #[serde(default)]
    pub read_only: bool,
    /// A Redis ACL user whose keys are this token's namespace only (`~<prefix>*`): scripts
    /// (EVAL, EVALSHA) run as that user, so Redis itself stops a script that reaches another
    /// key; Ferry checks its ACL (`ACL DRYRUN`) before the first script. Empty: scripts run as
    /// `redis_url`'s user for a whole-database token, and are refused for any other. Scripts run
    /// only on the door's own Redis.
    #[serde(default)]
    pub script_user: String,
    /// That user's password.
    #[serde(default)]
    pub script_password: Redacted<String>,
}

impl Config {
    pub(super) fn validate_upstash(&self) -> Result<(), ConfigError> {
        let invalid = |key: String, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.into(),
            })
        };
        let u = &self.upstash;
        if u.enabled && u.tokens.is_empty() {
            return invalid("upstash.tokens".into(), "give at least one token");
        }
        if u.pool_size == 0 {
            return invalid("upstash.pool_size".into(), "must be at least 1");
        }
        if u.enabled && !u.own_redis() && !u.share_cache_redis {
            return invalid(
                "upstash.redis_url".into(),
                "give the door a Redis of its own, or set upstash.share_cache_redis = true \
                 (unsafe: a token's commands can then slow, fill and evict the Redis that holds \
                 Ferry's cache and replay records)",
            );
        }
        if u.own_redis() && !u.share_cache_redis && same_server(&u.redis_url, &self.redis.url) {
            return invalid(
                "upstash.redis_url".into(),
                "is the cache's Redis server (redis.url) under another name or database: give \
                 the door a Redis of its own, or set upstash.share_cache_redis = true",
            );
        }
        if u.own_redis() && u.share_cache_redis {
            return invalid(
                "upstash.share_cache_redis".into(),
                "the door has a Redis of its own (upstash.redis_url): not both",
            );
        }
        for (i, t) in u.tokens.iter().enumerate() {
            if t.token.len() < 32 {
                return invalid(
                    format!("upstash.tokens[{i}].token"),
                    "at least 32 characters",
                );
            }
            if t.prefix.chars().any(char::is_control) {
                return invalid(
                    format!("upstash.tokens[{i}].prefix"),
                    "no control characters",
                );
            }
            if t.prefix.is_empty() && !u.own_redis() {
                return invalid(
                    format!("upstash.tokens[{i}].prefix"),
                    "a token owns the whole database (no prefix) only on a Redis of the door's \
                     own (upstash.redis_url): the cache's Redis holds Ferry's own keys",
                );
            }
            if t.script_user.is_empty() != t.script_password.is_empty() {
                return invalid(
                    format!("upstash.tokens[{i}].script_user"),
                    "set script_user and script_password together, or neither",
                );
            }
            // Two tokens may share a namespace (a read-write and a read-only one, as Upstash
            // gives each database), but no namespace may contain another's keys.
            let clash = u.tokens[..i].iter().any(|o| {
                o.token.as_str() == t.token.as_str()
                    || (o.prefix != t.prefix
                        && (o.prefix.starts_with(&t.prefix) || t.prefix.starts_with(&o.prefix)))
            });
            if clash {
                return invalid(
                    format!("upstash.tokens[{i}]"),
                    "tokens must be distinct, and no prefix may start another",
                );
            }
        }
        Ok(())
    }
}

/// Whether two Redis URLs reach one server: the same host and port once resolved
/// (`localhost` and `127.0.0.1` are one server; so are two databases of it).
fn same_server(a: &str, b: &str) -> bool {
    use std::net::ToSocketAddrs;
    let addrs = |url: &str| -> Vec<std::net::SocketAddr> {
        let Ok(info) = redis::IntoConnectionInfo::into_connection_info(url) else {
            return Vec::new();
        };
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
            _ => return Vec::new(),
        };
        (host.as_str(), port)
            .to_socket_addrs()
            .map(|i| i.collect())
            .unwrap_or_default()
    };
    let theirs = addrs(b);
    addrs(a).iter().any(|x| theirs.contains(x))
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_server_under_two_names_is_one_server() {
        use super::same_server;
        assert!(same_server(
            "redis://localhost:6390/1",
            "redis://127.0.0.1:6390"
        ));
        assert!(same_server(
            "redis://u:p@127.0.0.1:6390",
            "redis://127.0.0.1:6390/0"
        ));
        assert!(!same_server(
            "redis://127.0.0.1:6391",
            "redis://127.0.0.1:6390"
        ));
        assert!(!same_server("not a url", "redis://127.0.0.1:6390"));
    }
}

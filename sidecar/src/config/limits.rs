//! The request bounds, in one place: every size, TTL, key, tag, id and count check that a
//! handler makes goes through [`Limits`], so the rules and their messages cannot drift apart.
//! Each check takes the field it names as `impl Display` (a `&str`, or `format_args!` for
//! `keys[3]`): the name is written out only into an error, so a request that passes builds none.

use super::Config;
use crate::error::ApiError;
use std::fmt::Display;

/// Most tags one read may carry.
pub const MAX_TAGS: usize = 32;

/// Most rows and bytes one read may bring back, counted as rows arrive.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    pub max_rows: usize,
    pub max_bytes: usize,
}

/// A snapshot of the bounds in force (`cache.*` and `limits.*`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_key_bytes: usize,
    pub max_ttl_s: u64,
    pub max_batch: usize,
    pub max_invalidate_keys: usize,
    pub max_batch_bytes: usize,
    pub max_transaction_statements: usize,
    pub read: ReadLimits,
}

impl Limits {
    pub fn new(c: &Config) -> Limits {
        Limits {
            max_key_bytes: c.cache.max_key_bytes,
            max_ttl_s: c.cache.max_ttl_s,
            max_batch: c.cache.max_batch,
            max_invalidate_keys: c.limits.max_invalidate_keys,
            max_batch_bytes: c.limits.max_batch_bytes,
            max_transaction_statements: c.limits.max_transaction_statements,
            read: ReadLimits {
                max_rows: c.limits.max_read_rows,
                max_bytes: c.limits.max_read_bytes,
            },
        }
    }

    /// A cache key or tag: 1 to `cache.max_key_bytes` bytes, no control characters.
    pub fn key(&self, field: impl Display, key: &str) -> Result<(), ApiError> {
        let max = self.max_key_bytes;
        if key.is_empty() || key.len() > max {
            return Err(ApiError::invalid(
                field.to_string(),
                format!("must be 1 to {max} bytes"),
            ));
        }
        if key.chars().any(char::is_control) {
            return Err(ApiError::invalid(
                field.to_string(),
                "must not contain control characters",
            ));
        }
        Ok(())
    }

    /// A list of keys: 1 to `max` of them, each a valid key.
    pub fn keys(&self, field: impl Display, keys: &[String], max: usize) -> Result<(), ApiError> {
        if keys.is_empty() || keys.len() > max {
            return Err(ApiError::invalid(
                field.to_string(),
                format!("give 1 to {max} keys"),
            ));
        }
        keys.iter()
            .enumerate()
            .try_for_each(|(i, k)| self.key(format_args!("{field}[{i}]"), k))
    }

    /// Tags: at most MAX_TAGS, each a valid key.
    pub fn tags(&self, field: impl Display, tags: &[String]) -> Result<(), ApiError> {
        if tags.len() > MAX_TAGS {
            return Err(ApiError::invalid(
                field.to_string(),
                format!("at most {MAX_TAGS} tags"),
            ));
        }
        tags.iter()
            .enumerate()
            .try_for_each(|(i, t)| self.key(format_args!("{field}[{i}]"), t))
    }

    /// Keys a write invalidates by name: at most `limits.max_invalidate_keys`.
    pub fn invalidate_keys(&self, field: impl Display, keys: &[String]) -> Result<(), ApiError> {
        if keys.len() > self.max_invalidate_keys {
            return Err(ApiError::invalid(
                field.to_string(),
                format!(
                    "at most {} keys (limits.max_invalidate_keys); use a tag for more",
                    self.max_invalidate_keys
                ),
            ));
        }
        keys.iter()
            .enumerate()
            .try_for_each(|(i, k)| self.key(format_args!("{field}[{i}]"), k))
    }

    /// A TTL: 1 to `cache.max_ttl_s` seconds.
    pub fn ttl(&self, field: impl Display, s: u64) -> Result<(), ApiError> {
        self.check_seconds(field, s, 1)
    }

    /// A duration that may be 0 (stale-while-revalidate, stale-if-error): up to `max_ttl_s`.
    pub fn seconds(&self, field: impl Display, s: u64) -> Result<(), ApiError> {
        self.check_seconds(field, s, 0)
    }

    fn check_seconds(&self, field: impl Display, s: u64, min: u64) -> Result<(), ApiError> {
        let max = self.max_ttl_s;
        if s < min || s > max {
            return Err(ApiError::invalid(
                field.to_string(),
                format!("must be between {min} and {max} seconds"),
            ));
        }
        Ok(())
    }

    /// How many statements one transaction holds: 1 to `limits.max_transaction_statements`.
    pub fn transaction_statements(&self, field: impl Display, n: usize) -> Result<(), ApiError> {
        let max = self.max_transaction_statements;
        if n == 0 || n > max {
            return Err(ApiError::invalid(
                field.to_string(),
                format!("give 1 to {max} statements"),
            ));
        }
        Ok(())
    }

    /// How many items one batch holds: 1 to `cache.max_batch`.
    pub fn batch(&self, field: impl Display, n: usize, what: &str) -> Result<(), ApiError> {
        let max = self.max_batch;
        if n == 0 || n > max {
            return Err(ApiError::invalid(
                field.to_string(),
                format!("give 1 to {max} {what}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_one_message() {
        let l = Limits::new(&Config::default());
        for bad in ["", "a\u{0}b", &"k".repeat(513)] {
            let e = l.key("cache.key", bad).expect_err("refused");
            assert!(matches!(e, ApiError::InvalidValue { ref field, .. } if field == "cache.key"));
        }
        assert!(l.key("k", "items:7").is_ok());
        assert!(l.ttl("ttl_s", 0).is_err() && l.seconds("swr_s", 0).is_ok());
        assert!(l.ttl("ttl_s", l.max_ttl_s + 1).is_err());
        assert!(l.batch("ids", 0, "ids").is_err() && l.batch("ids", 1000, "ids").is_ok());
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| i.to_string()).collect();
        assert!(l.tags("tags", &many).is_err());
        assert!(l.keys("keys", &[], 10).is_err());
    }

    #[test]
    fn an_item_in_a_list_is_named_by_its_index() {
        let l = Limits::new(&Config::default());
        let list = ["ok".to_string(), String::new(), "ok".to_string()];
        let field = |r: Result<(), ApiError>| match r {
            Err(ApiError::InvalidValue { field, .. }) => field,
            other => panic!("refused with a field: {other:?}"),
        };
        assert_eq!(field(l.keys("keys", &list, 10)), "keys[1]");
        assert_eq!(field(l.tags("cache.tags", &list)), "cache.tags[1]");
        let prefixed = format_args!("reads[2].{}", "invalidate.keys");
        assert_eq!(
            field(l.invalidate_keys(prefixed, &list)),
            "reads[2].invalidate.keys[1]"
        );
    }
}

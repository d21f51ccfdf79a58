//! Neon-compatible SQL over HTTP (`POST /sql`, `[neon]`): the request as
//! `@neondatabase/serverless` sends it, checked and turned into a plan before any I/O.
//!
//! The driver sends one query (`{"query", "params"}`) or a batch (`{"queries": [...]}`, one
//! transaction), every parameter already as Postgres text, and its options as headers. It
//! names the database with a connection string (`Neon-Connection-String`): Ferry takes only
//! the password from it, as a token of `[[neon.tokens]]`, and never connects to the host it
//! names; the statements run on Ferry's own pooled sessions (`store::statements::text`).

use crate::config::{Config, NeonToken};
use crate::error::ApiError;
use crate::store::statements::class::{self, Route};
use crate::store::statements::text::{Query, SqlPlan};
use actix_web::http::header::HeaderMap;
use ferry_shared::api::Isolation;
use serde::Deserialize;
use serde_json::Value;

/// A request ready to run.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub plan: SqlPlan,
    /// Seconds to cache the result (`Ferry-Cache-TTL`), and the tables it reads.
    pub cache: Option<(u64, Vec<String>)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct QueryBody {
    query: String,
    #[serde(default)]
    params: Vec<Value>,
    #[serde(default)]
    array_mode: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Body {
    Single(QueryBody),
    Batch { queries: Vec<QueryBody> },
}

/// The configured token the connection string's password matches (constant time), or 401.
pub(crate) fn authenticate(headers: &HeaderMap, config: &Config) -> Result<NeonToken, ApiError> {
    let conn = header(headers, "neon-connection-string").ok_or_else(|| {
        ApiError::bad_request("send the connection string in the Neon-Connection-String header")
    })?;
    let password = password(conn).ok_or_else(|| {
        ApiError::bad_request("Neon-Connection-String is not a postgres:// URL with a password")
    })?;
    ferry_shared::token::find(&password, &config.neon.tokens, |t| t.token.as_str())
        .cloned()
        .ok_or(ApiError::Unauthorized {
            what: "token (the connection string's password)",
        })
}

/// Checks the body and headers; every refusal names what is wrong, before anything runs.
/// `user`: the end user the driver's `authToken` named (`http::end_user`, already verified).
pub(crate) fn plan(
    headers: &HeaderMap,
    body: &[u8],
    config: &Config,
    token: &NeonToken,
    user: Option<ferry_shared::api::Identity>,
) -> Result<Request, ApiError> {
    // Every statement here is raw SQL: an end user's identity needs identity.allow_raw_sql.
    let identity = crate::read::identity::identity(config, user, true, "")?;
    let body: Body = serde_json::from_slice(body).map_err(|_| {
        ApiError::bad_request(
            "the body must be {\"query\": SQL, \"params\": [...]} or {\"queries\": [...]}",
        )
    })?;
    let array_mode = flag(headers, "neon-array-mode");
    let (list, batch) = match body {
        Body::Single(q) => (vec![q], false),
        Body::Batch { queries } => (queries, true),
    };
    if list.is_empty() {
        return Err(ApiError::invalid("queries", "give at least one query"));
    }
    let limits = config.limits();
    if batch {
        limits.transaction_statements("queries", list.len())?;
    }
    let queries = list
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let field = if batch {
                format!("queries[{i}].")
            } else {
                String::new()
            };
            if q.query.trim().is_empty() {
                return Err(ApiError::invalid(
                    format!("{field}query"),
                    "must not be empty",
                ));
            }
            let checked = if token.read_only {
                class::check_read_only(&q.query, Route::Write)
            } else {
                class::check(&q.query, Route::Write)
            };
            checked.map_err(|e| in_batch(e, batch, i))?;
            let params = q
                .params
                .iter()
                .map(param_text)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ApiError::invalid(format!("{field}params"), "nested values must be arrays")
                })?;
            Ok(Query {
                sql: q.query,
                params,
                array_mode: q.array_mode.unwrap_or(array_mode),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let isolation = match header(headers, "neon-batch-isolation-level") {
        None => None,
        Some("Serializable") => Some(Isolation::Serializable),
        Some("RepeatableRead") => Some(Isolation::RepeatableRead),
        Some("ReadCommitted") => Some(Isolation::ReadCommitted),
        Some("ReadUncommitted") => Some(Isolation::ReadUncommitted),
        // Neon's words and status for any other value.
        Some(_) => {
            return Err(ApiError::BadRequest {
                message: "invalid isolation level".into(),
                field: Some("Neon-Batch-Isolation-Level".into()),
            })
        }
    };
    let cache = cache(headers, config, token, &queries, batch)?;
    Ok(Request {
        plan: SqlPlan {
            queries,
            batch,
            isolation,
            read_only: token.read_only || flag(headers, "neon-batch-read-only") || cache.is_some(),
            deferrable: flag(headers, "neon-batch-deferrable"),
            role: (!token.postgres_url.is_empty()).then(|| token.postgres_url.as_str().into()),
            identity,
        },
        cache,
    })
}

/// A batch's refusal names the statement (`statement` in the error), as `/v1/transaction` does.
fn in_batch(e: ApiError, batch: bool, i: usize) -> ApiError {
    if batch {
        e.in_statement(i)
    } else {
        e
    }
}

/// `Ferry-Cache-TTL` (seconds) and `Ferry-Cache-Tables` (comma-separated), as headers or as
/// `ferry_cache_ttl` / `ferry_cache_tables` in the connection string (which `neon()` sends
/// with every query, so one changed URL turns caching on); else the token's `cache_ttl_s`,
/// for single reads. No tables named: those Postgres says the read reads
/// (`read::inferred`). Only for one read, and only with the change stream on: writes sent here
/// carry no invalidation, so only Postgres's own change stream can drop the entries they make
/// stale.
fn cache(
    headers: &HeaderMap,
    config: &Config,
    token: &NeonToken,
    queries: &[Query],
    batch: bool,
) -> Result<Option<(u64, Vec<String>)>, ApiError> {
    let conn = header(headers, "neon-connection-string").unwrap_or_default();
    let ttl = header(headers, "ferry-cache-ttl")
        .map(str::to_string)
        .or_else(|| url_option(conn, "ferry_cache_ttl"));
    let Some(ttl) = ttl else {
        // The token's default (else the sidecar's) caches what it can: single reads, never a
        // batch or a write.
        let single_read = !batch && class::classify(&queries[0].sql, Route::Read).is_none();
        let default = (config.cache.default_ttl_s > 0 && config.changes.enabled)
            .then_some(config.cache.default_ttl_s);
        return Ok(token
            .cache_ttl_s
            .or(default)
            .filter(|_| single_read)
            .map(|t| (t, Vec::new())));
    };
    let ttl: u64 = ttl
        .trim()
        .parse()
        .map_err(|_| ApiError::invalid("Ferry-Cache-TTL", "a whole number of seconds"))?;
    config.limits().ttl("Ferry-Cache-TTL", ttl)?;
    if batch {
        return Err(ApiError::invalid(
            "Ferry-Cache-TTL",
            "caches one query, not a batch",
        ));
    }
    if !config.changes.enabled {
        return Err(ApiError::invalid(
            "Ferry-Cache-TTL",
            "caching /sql reads needs [changes] on: writes sent here carry no invalidation",
        ));
    }
    class::check(&queries[0].sql, Route::Read)?;
    let tables: Vec<String> = header(headers, "ferry-cache-tables")
        .map(str::to_string)
        .or_else(|| url_option(conn, "ferry_cache_tables"))
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    Ok(Some((ttl, tables)))
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Neon's rule: a flag header is on only when it is exactly `true`.
fn flag(headers: &HeaderMap, name: &str) -> bool {
    header(headers, name) == Some("true")
}

/// The percent-decoded password of a `postgres://` / `postgresql://` URL.
fn password(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _host) = authority.rsplit_once('@')?;
    let (_user, password) = userinfo.split_once(':')?;
    percent_decode(password)
}

/// A query option of the connection string (`?a=1&b=2`), percent-decoded.
fn url_option(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1.split('#').next()?;
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| percent_decode(v)).flatten()
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A JSON parameter as Postgres text (the driver sends strings already; plain `fetch` callers
/// may send numbers, booleans, objects and arrays). None: an array holds something that is
/// not a value.
fn param_text(v: &Value) -> Option<Option<String>> {
    Some(match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Object(_) => Some(v.to_string()),
        Value::Array(items) => Some(array_literal(items)?),
    })
}

/// `["a", null, ["b"]]` as the array literal `{"a",NULL,{"b"}}`.
fn array_literal(items: &[Value]) -> Option<String> {
    let mut out = String::from("{");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match item {
            Value::Null => out.push_str("NULL"),
            Value::Array(inner) => out.push_str(&array_literal(inner)?),
            other => {
                let text = param_text(other)??;
                crate::store::statements::params::push_element(&mut out, &text);
            }
        }
    }
    out.push('}');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_password_is_taken_from_the_url_only() {
        assert_eq!(
            password("postgresql://app:tok%2Den@db.example.com/app?sslmode=require").as_deref(),
            Some("tok-en")
        );
        assert_eq!(password("postgres://app@host/db"), None);
        assert_eq!(password("mysql://a:b@host/db"), None);
        assert_eq!(password("postgres://a:b%zz@host/db"), None);
        assert_eq!(
            url_option(
                "postgres://a:b@h/d?application_name=x&ferry_cache_ttl=60",
                "ferry_cache_ttl"
            )
            .as_deref(),
            Some("60")
        );
    }

    #[test]
    fn json_params_become_postgres_text() {
        assert_eq!(param_text(&json!(null)), Some(None));
        assert_eq!(param_text(&json!(7)), Some(Some("7".into())));
        assert_eq!(param_text(&json!({"a": 1})), Some(Some("{\"a\":1}".into())));
        assert_eq!(
            param_text(&json!(["a\"b", null, [1]])),
            Some(Some("{\"a\\\"b\",NULL,{\"1\"}}".into()))
        );
    }
}

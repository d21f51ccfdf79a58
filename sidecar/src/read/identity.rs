//! A request's `identity` → who its statement runs as, checked before any I/O: the role must be
//! one the config allows, the claims bounded, and raw SQL refused unless the config accepts the
//! risk (`identity.allow_raw_sql`).

use crate::config::{Config, MAX_CLAIMS_BYTES};
use crate::error::ApiError;
use crate::store::postgres::identity::SessionIdentity;
use ferry_shared::api::Identity;
use serde_json::Value;
use std::sync::Arc;

/// `raw_sql`: the statement came as SQL in the request rather than from `[queries.NAME]`.
/// `field` prefixes error fields (`"reads[3]."` in batches).
pub(crate) fn identity(
    config: &Config,
    asked: Option<Identity>,
    raw_sql: bool,
    field: &str,
) -> Result<Option<Arc<SessionIdentity>>, ApiError> {
    let Some(asked) = asked else {
        return Ok(None);
    };
    let c = &config.identity;
    if !c.roles.contains(&asked.role) {
        return Err(ApiError::RoleNotAllowed { role: asked.role });
    }
    if raw_sql && !c.allow_raw_sql {
        return Err(ApiError::invalid(
            format!("{field}sql"),
            "a request with an identity runs only named queries (\"query\": \"NAME\"): raw SQL \
             could end the assumed role (identity.allow_raw_sql is off)",
        ));
    }
    // `sub` as policies read it (`->> 'sub'`: text), so "7" and 7 are one user.
    let user = match asked.claims.get("sub") {
        Some(Value::String(sub)) => format!("{}\nsub:{sub}", asked.role),
        Some(sub) => format!("{}\nsub:{sub}", asked.role),
        None => String::new(),
    };
    // serde_json writes an object's keys sorted: the same claims are always the same text.
    let claims = Value::Object(asked.claims).to_string();
    if claims.len() > MAX_CLAIMS_BYTES {
        return Err(ApiError::invalid(
            format!("{field}identity.claims"),
            format!("at most {MAX_CLAIMS_BYTES} bytes as JSON"),
        ));
    }
    let user = if user.is_empty() {
        format!("{}\nclaims:{claims}", asked.role)
    } else {
        user
    };
    Ok(Some(Arc::new(SessionIdentity {
        role: asked.role,
        claims,
        setting: c.claims_setting.clone(),
        user,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> Config {
        let mut c = Config::default();
        c.identity.roles = vec!["authenticated".into()];
        c
    }

    fn who(role: &str, claims: Value) -> Option<Identity> {
        Some(Identity {
            role: role.into(),
            claims: claims.as_object().cloned().unwrap_or_default(),
        })
    }

    #[test]
    fn only_configured_roles_and_named_queries() {
        let c = config();
        let seven = |sub: Value| {
            identity(&c, who("authenticated", json!({ "sub": sub })), false, "")
                .unwrap()
                .unwrap()
                .user
                .clone()
        };
        assert_eq!(
            seven(json!("7")),
            seven(json!(7)),
            "one user, as RLS reads it"
        );
        let ok = identity(&c, who("authenticated", json!({"sub": "a"})), false, "").unwrap();
        assert_eq!(ok.unwrap().claims, r#"{"sub":"a"}"#);
        for role in ["postgres", "Authenticated", ""] {
            assert!(matches!(
                identity(&c, who(role, json!({})), false, ""),
                Err(ApiError::RoleNotAllowed { .. })
            ));
        }
        assert!(matches!(
            identity(&c, who("authenticated", json!({})), true, ""),
            Err(ApiError::InvalidValue { .. })
        ));
        let mut open = config();
        open.identity.allow_raw_sql = true;
        assert!(identity(&open, who("authenticated", json!({})), true, "").is_ok());
        assert!(matches!(
            identity(
                &Config::default(),
                who("authenticated", json!({})),
                false,
                ""
            ),
            Err(ApiError::RoleNotAllowed { .. })
        ));
    }

    #[test]
    fn claims_are_bounded_and_canonical() {
        let c = config();
        let big = json!({"x": "y".repeat(MAX_CLAIMS_BYTES)});
        assert!(matches!(
            identity(&c, who("authenticated", big), false, "reads[1]."),
            Err(ApiError::InvalidValue { field, .. }) if field == "reads[1].identity.claims"
        ));
        let a = identity(&c, who("authenticated", json!({"b": 1, "a": 2})), false, "");
        let b = identity(&c, who("authenticated", json!({"a": 2, "b": 1})), false, "");
        assert_eq!(a.unwrap(), b.unwrap());
    }
}

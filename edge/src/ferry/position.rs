//! Read-your-writes across requests: the position a write returned, carried to the next
//! request in a cookie. Within a request the [`Ferry`](super::Ferry) handle carries it itself.
//!
//! The cookie is signed (HMAC-SHA256 with the edge's secret, 128 bits): the browser sends it
//! back, and a position it made up would send every read it makes past the cache (a position
//! the change stream has not reached skips the cache), which is an anonymous client loading
//! Postgres at will. A cookie that does not verify is no position at all. A genuine one can only
//! be one this edge gave out after a write the caller was allowed to make.

use ferry_shared::api::Position;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The cookie's name.
pub const POSITION_COOKIE: &str = "ferry_position";

/// How long the cookie lasts, in seconds: long past any lag a replica in use may have.
pub const POSITION_COOKIE_MAX_AGE_S: u32 = 60;

/// Bytes of the MAC kept in the cookie (hex: twice as many characters).
const TAG_BYTES: usize = 16;

/// The MAC of a position, keyed by `secret`; the label keeps it from ever equalling a MAC the
/// sidecar's request signing makes with the same secret.
fn mac(secret: &[u8], position: &str) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| <Hmac<Sha256> as Mac>::new(&Default::default()));
    m.update(b"ferry_position\0");
    m.update(position.as_bytes());
    m
}

/// A `Set-Cookie` value that carries `position` to the same site's next requests, signed with
/// `secret` (the edge's `FERRY_SECRET`).
pub fn position_cookie(position: Position, secret: &[u8]) -> String {
    let p = position.to_string();
    let tag = hex::encode(&mac(secret, &p).finalize().into_bytes()[..TAG_BYTES]);
    format!(
        "{POSITION_COOKIE}={p}.{tag}; Path=/; Max-Age={POSITION_COOKIE_MAX_AGE_S}; HttpOnly; \
         Secure; SameSite=Lax"
    )
}

/// The position in a request's `Cookie` header, if it holds a well-formed one that `secret`
/// signed (checked in constant time).
pub fn position_from_cookies(header: &str, secret: &[u8]) -> Option<Position> {
    header.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        if name != POSITION_COOKIE {
            return None;
        }
        let (p, tag) = value.trim().split_once('.')?;
        let tag = hex::decode(tag).ok().filter(|t| t.len() == TAG_BYTES)?;
        mac(secret, p).verify_truncated_left(&tag).ok()?;
        p.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"edge-secret-0123456789";

    fn pair(set: &str) -> &str {
        set.split(';').next().expect("pair")
    }

    #[test]
    fn a_position_goes_out_in_a_signed_cookie_and_comes_back() {
        let p: Position = "16/B374D848".parse().expect("valid");
        let set = position_cookie(p, KEY);
        assert!(set.starts_with("ferry_position=16/B374D848."), "{set}");
        assert!(set.contains("HttpOnly") && set.contains("Secure"));
        let header = format!("theme=dark; {}; other=1", pair(&set));
        assert_eq!(position_from_cookies(&header, KEY), Some(p));
        assert_eq!(position_from_cookies(&header, b"another-key-0123456"), None);
    }

    #[test]
    fn a_missing_malformed_or_forged_cookie_is_no_position() {
        let genuine = position_cookie("1/2".parse().expect("valid"), KEY);
        let tag = pair(&genuine).rsplit('.').next().expect("tag").to_string();
        for header in [
            "".to_string(),
            "theme=dark".into(),
            "ferry_position=".into(),
            "ferry_position=nope".into(),
            "ferry_position=1/2".into(),
            "ferry_position=FFFFFFFF/0".into(),
            format!("ferry_position=FFFFFFFF/0.{tag}"),
            format!("ferry_position=1/2.{}", &tag[..30]),
            format!("ferry_position=1/2/3.{tag}"),
            format!("x{}", pair(&genuine)),
        ] {
            assert_eq!(position_from_cookies(&header, KEY), None, "{header:?}");
        }
    }
}

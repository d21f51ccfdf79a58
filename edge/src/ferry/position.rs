//! Read-your-writes across requests: the position a write returned, carried to the next
//! request in a cookie. Within a request the [`Ferry`](super::Ferry) handle carries it itself.
//!
//! The cookie is the browser's to send back, so it is only a hint: a made-up position can only
//! send that caller's own reads to the primary (one too far ahead) or let them miss that
//! caller's own writes (one too far back), never touch another caller's.

use ferry_shared::api::Position;

/// The cookie's name.
pub const POSITION_COOKIE: &str = "ferry_position";

/// How long the cookie lasts, in seconds: long past any lag a replica in use may have.
pub const POSITION_COOKIE_MAX_AGE_S: u32 = 60;

/// A `Set-Cookie` value that carries `position` to the same site's next requests.
pub fn position_cookie(position: Position) -> String {
    format!(
        "{POSITION_COOKIE}={position}; Path=/; Max-Age={POSITION_COOKIE_MAX_AGE_S}; HttpOnly; \
         Secure; SameSite=Lax"
    )
}

/// The position in a request's `Cookie` header, if it holds a well-formed one.
pub fn position_from_cookies(header: &str) -> Option<Position> {
    header.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        (name == POSITION_COOKIE)
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_goes_out_in_a_cookie_and_comes_back() {
        let p: Position = "16/B374D848".parse().expect("valid");
        let set = position_cookie(p);
        assert!(set.starts_with("ferry_position=16/B374D848; "), "{set}");
        assert!(set.contains("HttpOnly") && set.contains("Secure"));
        let header = "theme=dark; ferry_position=16/B374D848; other=1";
        assert_eq!(position_from_cookies(header), Some(p));
    }

    #[test]
    fn a_missing_or_malformed_cookie_is_no_position() {
        for header in [
            "",
            "theme=dark",
            "ferry_position=",
            "ferry_position=nope",
            "ferry_position=1/2/3",
            "xferry_position=1/2",
        ] {
            assert_eq!(position_from_cookies(header), None, "{header:?}");
        }
    }
}

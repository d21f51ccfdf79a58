//! Bearer credentials, one rule each for reading and comparing them: the edge's API key, the
//! Upstash and Neon doors' tokens, end users' JWTs.

use sha2::{Digest, Sha256};

/// The credential of an `Authorization: Bearer <credential>` header (the scheme in any case,
/// RFC 7235), trimmed; None when there is none.
///
/// ```
/// use ferry_shared::token::bearer;
/// assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
/// assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
/// assert_eq!(bearer(Some("Basic abc")), None);
/// assert_eq!(bearer(Some("Bearer ")), None);
/// ```
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let h = authorization?;
    let (scheme, rest) = (h.get(..7)?, h.get(7..)?);
    if !scheme.eq_ignore_ascii_case("bearer ") {
        return None;
    }
    Some(rest.trim()).filter(|t| !t.is_empty())
}

/// Whether two secrets are equal, in time that depends on neither their contents nor their
/// lengths (their SHA-256 digests are compared, every byte).
pub fn same(a: &str, b: &str) -> bool {
    let (x, y) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

/// The first of `known` whose credential (`key`) is `given`; every one is compared, so the
/// time taken says nothing about which matched.
pub fn find<'a, T>(given: &str, known: &'a [T], key: impl Fn(&T) -> &str) -> Option<&'a T> {
    let mut found = None;
    for t in known {
        if same(key(t), given) && found.is_none() {
            found = Some(t);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_door() {
        assert_eq!(bearer(Some("BEARER x")), Some("x"));
        assert_eq!(bearer(Some("Bearerx")), None);
        assert_eq!(bearer(None), None);
        assert!(same("a", "a") && !same("a", "b") && !same("a", "aa"));
        let known = ["one", "two", "two"];
        assert_eq!(find("two", &known, |k| k), Some(&"two"));
        assert!(std::ptr::eq(find("two", &known, |k| k).unwrap(), &known[1]));
        assert_eq!(find("three", &known, |k| k), None);
    }
}

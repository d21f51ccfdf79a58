//! Unit tests of `sign.rs` (kept apart so the module stays short).
use super::*;

const SECRET: &[u8] = b"test-secret";
const NONCE: &str = "0123456789abcdef";
const NOW: u64 = 1_700_000_000;

fn signed(body: &[u8]) -> SignatureHeaders {
    sign(SECRET, NOW, NONCE, "post", "/v1/query?x=1", body)
}

fn check(h: &SignatureHeaders, body: &[u8], now: u64) -> Result<Verified, SignError> {
    verify(
        &[SECRET],
        &SignedRequest {
            headers: h,
            method: "POST",
            path_and_query: "/v1/query?x=1",
            body,
        },
        now,
        300,
    )
}

#[test]
fn known_vector() {
    // Pinned so that any change to the canonical string is a visible wire break.
    let canonical = canonical_string(NOW, NONCE, "post", "/v1/query", b"{}");
    assert_eq!(
        canonical,
        "1700000000\n0123456789abcdef\nPOST\n/v1/query\n\
         44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    // The MAC is HMAC-SHA256 of exactly those bytes (computed apart, with Python's hmac).
    let h = sign(SECRET, NOW, NONCE, "post", "/v1/query", b"{}");
    assert_eq!(
        h.signature,
        "v1=671d04fbde85a6ff7c5fe9e10eea3886002a08a4baf3fd1f87bb6a85c053fa54"
    );
}

#[test]
fn the_mac_covers_the_canonical_string_byte_for_byte() {
    // The MAC is fed piece by piece; it must equal one over the canonical string, whatever the
    // method's case or length, the timestamp's width and the body.
    let cases: [(u64, &str, &[u8]); 6] = [
        (0, "get", b""),
        (9, "POST", b"{}"),
        (10, "pOsT", b"x"),
        (NOW, "A-VERY-LONG-EXTENSION-method", b"body"),
        (u64::MAX, "m", &[0, 255, 10]),
        (1_000_000, "", b"\n\n"),
    ];
    for (ts, method, body) in cases {
        let canonical = canonical_string(ts, NONCE, method, "/p?q=1", body);
        let mut whole = HmacSha256::new_from_slice(SECRET).expect("any key length");
        whole.update(canonical.as_bytes());
        let expected = format!("v1={}", hex::encode(whole.finalize().into_bytes()));
        let h = sign(SECRET, ts, NONCE, method, "/p?q=1", body);
        assert_eq!(h.signature, expected, "{ts} {method}");
    }
}

#[test]
fn round_trip() {
    let h = signed(b"{\"a\":1}");
    let v = check(&h, b"{\"a\":1}", NOW).expect("valid signature");
    assert_eq!(v.timestamp, NOW);
    assert_eq!(v.nonce, NONCE);
}

#[test]
fn any_change_is_rejected() {
    let h = signed(b"body");
    assert_eq!(check(&h, b"bodz", NOW), Err(SignError::Mismatch));
    assert_eq!(
        verify(
            &[SECRET],
            &SignedRequest {
                headers: &h,
                method: "PUT",
                path_and_query: "/v1/query?x=1",
                body: b"body"
            },
            NOW,
            300
        ),
        Err(SignError::Mismatch)
    );
    assert_eq!(
        verify(
            &[SECRET],
            &SignedRequest {
                headers: &h,
                method: "POST",
                path_and_query: "/v1/query?x=2",
                body: b"body"
            },
            NOW,
            300
        ),
        Err(SignError::Mismatch)
    );
    assert_eq!(
        verify(
            &[b"other"],
            &SignedRequest {
                headers: &h,
                method: "POST",
                path_and_query: "/v1/query?x=1",
                body: b"body"
            },
            NOW,
            300
        ),
        Err(SignError::Mismatch)
    );
    let mut other_nonce = h.clone();
    other_nonce.nonce = "fedcba9876543210".into();
    assert_eq!(check(&other_nonce, b"body", NOW), Err(SignError::Mismatch));
}

#[test]
fn clock_window_both_ways() {
    let h = signed(b"");
    assert!(check(&h, b"", NOW + 300).is_ok());
    assert!(check(&h, b"", NOW - 300).is_ok());
    assert_eq!(check(&h, b"", NOW + 301), Err(SignError::Expired));
    assert_eq!(check(&h, b"", NOW - 301), Err(SignError::Expired));
}

#[test]
fn malformed_headers() {
    let good = signed(b"");
    type Mutation = fn(&mut SignatureHeaders);
    let cases: Vec<(Mutation, &str)> = vec![
        (|h| h.timestamp = "-1".into(), HEADER_TIMESTAMP),
        (|h| h.timestamp = "".into(), HEADER_TIMESTAMP),
        (|h| h.timestamp = "1e9".into(), HEADER_TIMESTAMP),
        (
            |h| h.timestamp = "99999999999999999999999".into(),
            HEADER_TIMESTAMP,
        ),
        (|h| h.nonce = "short".into(), HEADER_NONCE),
        (|h| h.nonce = "zzzzzzzzzzzzzzzz".into(), HEADER_NONCE),
        (|h| h.nonce = "a".repeat(65), HEADER_NONCE),
        (
            |h| h.signature = h.signature[3..].to_string(),
            HEADER_SIGNATURE,
        ),
        (|h| h.signature.truncate(40), HEADER_SIGNATURE),
        (
            |h| h.signature = format!("v2={}", &h.signature[3..]),
            HEADER_SIGNATURE,
        ),
        (
            |h| h.signature = format!("v1={}", "g".repeat(64)),
            HEADER_SIGNATURE,
        ),
    ];
    for (mutate, header) in cases {
        let mut h = good.clone();
        mutate(&mut h);
        assert_eq!(
            check(&h, b"", NOW),
            Err(SignError::Malformed(header)),
            "{h:?}"
        );
    }
}

#[test]
fn missing_headers() {
    assert_eq!(
        parse_headers(None, Some("n"), Some("s")),
        Err(SignError::Missing(HEADER_TIMESTAMP))
    );
    assert_eq!(
        parse_headers(Some("1"), None, Some("s")),
        Err(SignError::Missing(HEADER_NONCE))
    );
    assert_eq!(
        parse_headers(Some("1"), Some("n"), None),
        Err(SignError::Missing(HEADER_SIGNATURE))
    );
}

#[test]
fn rotation_accepts_either_secret() {
    let h = signed(b"x");
    let req = SignedRequest {
        headers: &h,
        method: "POST",
        path_and_query: "/v1/query?x=1",
        body: b"x",
    };
    let r = verify(&[b"new", SECRET], &req, NOW, 300);
    assert!(r.is_ok());
}

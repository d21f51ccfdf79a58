//! Request signing: `x-ferry-signature: v1=<hex HMAC-SHA256>` over a canonical string.
//!
//! The canonical string binds the signature to one moment, one nonce, one method, one path and
//! one exact body:
//!
//! ```text
//! {timestamp}\n{nonce}\n{METHOD}\n{path and query}\n{hex sha256 of body}
//! ```
//!
//! Verification here is stateless (format, clock window, MAC). Replay protection needs memory of
//! nonces already seen, which the sidecar keeps; this module only checks the nonce's shape.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

pub const HEADER_TIMESTAMP: &str = "x-ferry-timestamp";
pub const HEADER_NONCE: &str = "x-ferry-nonce";
pub const HEADER_SIGNATURE: &str = "x-ferry-signature";

/// How far a request's timestamp may be from the verifier's clock, either way, in seconds.
/// Small, because replay protection remembers every nonce this long (see the sidecar's
/// `replay.rs`); synchronized clocks and a request in flight need far less.
pub const DEFAULT_MAX_SKEW_S: u64 = 30;

/// Nonce length bounds, in hex characters. 16 hex chars = 64 random bits.
pub const NONCE_MIN_LEN: usize = 16;
pub const NONCE_MAX_LEN: usize = 64;

const SIGNATURE_PREFIX: &str = "v1=";

type HmacSha256 = Hmac<Sha256>;

/// The three signature headers of one request, as strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureHeaders {
    pub timestamp: String,
    pub nonce: String,
    pub signature: String,
}

/// Why a signature was refused. Each maps to one stable wire code (see [`SignError::code`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignError {
    /// A header is absent (its name is given).
    Missing(&'static str),
    /// A header is present but not in the expected format (its name is given).
    Malformed(&'static str),
    /// The timestamp is more than the allowed skew away from the verifier's clock.
    Expired,
    /// The MAC does not match under any accepted secret.
    Mismatch,
}

impl SignError {
    /// The stable error code sent on the wire for this failure.
    pub fn code(&self) -> crate::ErrorCode {
        use crate::ErrorCode;
        match self {
            SignError::Missing(_) => ErrorCode::AuthMissing,
            SignError::Malformed(_) => ErrorCode::AuthMalformed,
            SignError::Expired => ErrorCode::AuthExpired,
            SignError::Mismatch => ErrorCode::AuthBadSignature,
        }
    }

    /// A message safe to show the caller (it says what is wrong, never what was expected).
    pub fn message(&self) -> String {
        match self {
            SignError::Missing(h) => format!("missing header {h}"),
            SignError::Malformed(h) => format!("malformed header {h}"),
            SignError::Expired => {
                "request timestamp is outside the allowed clock window".to_string()
            }
            SignError::Mismatch => "signature does not match".to_string(),
        }
    }
}

impl std::fmt::Display for SignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for SignError {}

/// Lowercase hex SHA-256 of `body` (the empty body has a digest too).
pub fn body_digest(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// The exact bytes that are MAC'd. `method` is upper-cased here so callers cannot disagree.
pub fn canonical_string(
    timestamp: u64,
    nonce: &str,
    method: &str,
    path_and_query: &str,
    body: &[u8],
) -> String {
    format!(
        "{timestamp}\n{nonce}\n{}\n{path_and_query}\n{}",
        method.to_ascii_uppercase(),
        body_digest(body)
    )
}

/// The MAC of [`canonical_string`]'s bytes, fed to HMAC piece by piece: no string is built,
/// which a verifier does for every request under every accepted secret.
fn mac_for(
    secret: &[u8],
    timestamp: u64,
    nonce: &str,
    method: &str,
    path_and_query: &str,
    digest: &[u8; 64],
) -> HmacSha256 {
    // HMAC accepts keys of any length, so new_from_slice cannot fail; the fallback keeps this
    // function total without an unwrap.
    let mut mac = HmacSha256::new_from_slice(secret)
        .unwrap_or_else(|_| <HmacSha256 as Mac>::new(&Default::default()));
    let mut digits = [0u8; 20];
    mac.update(decimal(timestamp, &mut digits));
    mac.update(b"\n");
    mac.update(nonce.as_bytes());
    mac.update(b"\n");
    // Upper-cased through a small buffer (methods are short tokens, usually upper-case already).
    for chunk in method.as_bytes().chunks(16) {
        let mut upper = [0u8; 16];
        let upper = &mut upper[..chunk.len()];
        upper.copy_from_slice(chunk);
        upper.make_ascii_uppercase();
        mac.update(upper);
    }
    mac.update(b"\n");
    mac.update(path_and_query.as_bytes());
    mac.update(b"\n");
    mac.update(digest);
    mac
}

/// `n` in decimal, as `format!("{n}")` writes it, into `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// [`body_digest`] into a buffer.
fn body_digest_hex(body: &[u8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    // 32 bytes always fit 64 hex digits, so this cannot fail.
    let _ = hex::encode_to_slice(Sha256::digest(body), &mut out);
    out
}

/// Signs one request. `nonce` must be 16-64 hex characters of fresh randomness (the caller
/// supplies it: this crate has no random source, so it stays portable to wasm).
pub fn sign(
    secret: &[u8],
    timestamp: u64,
    nonce: &str,
    method: &str,
    path_and_query: &str,
    body: &[u8],
) -> SignatureHeaders {
    let digest = body_digest_hex(body);
    let tag = mac_for(secret, timestamp, nonce, method, path_and_query, &digest)
        .finalize()
        .into_bytes();
    SignatureHeaders {
        timestamp: timestamp.to_string(),
        nonce: nonce.to_string(),
        signature: format!("{SIGNATURE_PREFIX}{}", hex::encode(tag)),
    }
}

/// A request whose signature checked out: what the verifier needs for replay protection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub timestamp: u64,
    pub nonce: String,
    /// The index (in `secrets`) of the first secret the signature matched: the credential.
    pub secret: usize,
}

/// Parses the three header values. `None` means the header was absent.
pub fn parse_headers(
    timestamp: Option<&str>,
    nonce: Option<&str>,
    signature: Option<&str>,
) -> Result<SignatureHeaders, SignError> {
    let timestamp = timestamp.ok_or(SignError::Missing(HEADER_TIMESTAMP))?;
    let nonce = nonce.ok_or(SignError::Missing(HEADER_NONCE))?;
    let signature = signature.ok_or(SignError::Missing(HEADER_SIGNATURE))?;
    Ok(SignatureHeaders {
        timestamp: timestamp.to_string(),
        nonce: nonce.to_string(),
        signature: signature.to_string(),
    })
}

fn parse_timestamp(s: &str) -> Result<u64, SignError> {
    // Digits only (no sign, no spaces); 20 digits is u64's width.
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignError::Malformed(HEADER_TIMESTAMP));
    }
    s.parse()
        .map_err(|_| SignError::Malformed(HEADER_TIMESTAMP))
}

/// Whether `s` has a nonce's shape: 16 to 64 hex characters.
pub fn valid_nonce(s: &str) -> bool {
    (NONCE_MIN_LEN..=NONCE_MAX_LEN).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn check_nonce(s: &str) -> Result<(), SignError> {
    if valid_nonce(s) {
        Ok(())
    } else {
        Err(SignError::Malformed(HEADER_NONCE))
    }
}

fn parse_signature(s: &str) -> Result<[u8; 32], SignError> {
    let hex_part = s
        .strip_prefix(SIGNATURE_PREFIX)
        .ok_or(SignError::Malformed(HEADER_SIGNATURE))?;
    // Exactly one SHA-256 tag; a truncated tag is malformed, not a shorter valid MAC.
    if hex_part.len() != 64 {
        return Err(SignError::Malformed(HEADER_SIGNATURE));
    }
    let mut tag = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut tag).map_err(|_| SignError::Malformed(HEADER_SIGNATURE))?;
    Ok(tag)
}

/// The cheap checks, made before the body is read: header formats and the clock window.
/// Returns the timestamp and the MAC tag.
pub fn check_headers(
    headers: &SignatureHeaders,
    now_s: u64,
    max_skew_s: u64,
) -> Result<(u64, [u8; 32]), SignError> {
    let timestamp = parse_timestamp(&headers.timestamp)?;
    check_nonce(&headers.nonce)?;
    let tag = parse_signature(&headers.signature)?;
    if timestamp.abs_diff(now_s) > max_skew_s {
        return Err(SignError::Expired);
    }
    Ok((timestamp, tag))
}

/// What a signature covers: one request as received.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    pub headers: &'a SignatureHeaders,
    pub method: &'a str,
    /// The path and query exactly as sent (`/v1/query?x=1`).
    pub path_and_query: &'a str,
    pub body: &'a [u8],
}

/// Verifies a request statelessly: header formats, the clock window, then the MAC under each
/// accepted secret (more than one during a secret rotation). The MAC comparison is
/// constant-time (`hmac`'s `verify_slice`).
pub fn verify<S: AsRef<[u8]>>(
    secrets: &[S],
    req: &SignedRequest<'_>,
    now_s: u64,
    max_skew_s: u64,
) -> Result<Verified, SignError> {
    let checked = check_headers(req.headers, now_s, max_skew_s)?;
    verify_checked(secrets, req, &checked)
}

/// [`verify`] for a request whose headers [`check_headers`] has already passed (a server
/// checks them before reading the body): `checked` is what that call returned.
pub fn verify_checked<S: AsRef<[u8]>>(
    secrets: &[S],
    req: &SignedRequest<'_>,
    checked: &(u64, [u8; 32]),
) -> Result<Verified, SignError> {
    let headers = req.headers;
    let (timestamp, tag) = (checked.0, &checked.1);
    let digest = body_digest_hex(req.body);
    // Every secret is tried, even after a match, so timing does not reveal which one matched.
    let mut matched = None;
    for (i, secret) in secrets.iter().enumerate() {
        let mac = mac_for(
            secret.as_ref(),
            timestamp,
            &headers.nonce,
            req.method,
            req.path_and_query,
            &digest,
        );
        if mac.verify_slice(tag).is_ok() && matched.is_none() {
            matched = Some(i);
        }
    }
    if let Some(secret) = matched {
        Ok(Verified {
            timestamp,
            nonce: headers.nonce.clone(),
            secret,
        })
    } else {
        Err(SignError::Mismatch)
    }
}

#[cfg(test)]
#[path = "sign_tests.rs"]
mod tests;

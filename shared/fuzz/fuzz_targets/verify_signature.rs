//! Signature verification on arbitrary headers, method, path and body: never panics, never
//! accepts a forgery (anything not produced by `sign` with the secret), and always accepts
//! what `sign` produced for the same inputs.
#![no_main]

use ferry_shared::sign::{self, SignatureHeaders, SignedRequest};
use libfuzzer_sys::fuzz_target;

const SECRET: &[u8] = b"fuzz-secret-0123456789";
const NOW: u64 = 1_700_000_000;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(6, '\n');
    let mut next = || parts.next().unwrap_or_default().to_string();
    let (ts, nonce, sig, method, path, body) = (next(), next(), next(), next(), next(), next());
    let headers = SignatureHeaders { timestamp: ts.clone(), nonce: nonce.clone(), signature: sig.clone() };
    let req = |headers| SignedRequest { headers, method: &method, path_and_query: &path, body: body.as_bytes() };
    if let Ok(v) = sign::verify(&[SECRET], &req(&headers), NOW, 300) {
        // Accepted: it must be exactly what the signer would have produced.
        let expected = sign::sign(SECRET, v.timestamp, &nonce, &method, &path, body.as_bytes());
        assert_eq!(expected.signature.to_ascii_lowercase(), sig.to_ascii_lowercase());
    }
    // What `sign` produces always verifies (for well-formed nonces and fresh timestamps).
    if nonce.len() >= 16 && nonce.len() <= 64 && nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        let good = sign::sign(SECRET, NOW, &nonce, &method, &path, body.as_bytes());
        assert!(sign::verify(&[SECRET], &req(&good), NOW, 300).is_ok());
    }
});

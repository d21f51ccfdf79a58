//! A request's nonce as the stores see it: 128 bits of its hash, its signed second, and the
//! second after which the timestamp check alone refuses it. The local replay store
//! (`http/replay.rs`) makes one per request; the shared stores (`nonces`) keep it.

use sha2::{Digest, Sha256};

/// A request's nonce, for the stores other sidecars share (`super`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    /// 128 bits of SHA-256 of the lower-cased nonce.
    pub fingerprint: u128,
    /// The signed timestamp (a replay carries the same one).
    pub timestamp: u64,
    /// The Unix second after which the timestamp check alone refuses the request.
    pub until_s: u64,
}

impl Seen {
    pub(crate) fn hex(&self) -> String {
        format!("{:032x}", self.fingerprint)
    }
}

/// 128 bits of SHA-256 of the lower-cased nonce: fixed size whatever the nonce's length, and
/// no two nonces collide in practice ("ABCD..." and "abcd..." are the same random number).
pub(crate) fn fingerprint(nonce: &str) -> u128 {
    // Lower-cased on the stack: a checked nonce has at most NONCE_MAX_LEN characters.
    let mut buf = [0u8; ferry_shared::sign::NONCE_MAX_LEN];
    let digest = match buf.get_mut(..nonce.len()) {
        Some(lower) => {
            lower.copy_from_slice(nonce.as_bytes());
            lower.make_ascii_lowercase();
            Sha256::digest(lower)
        }
        None => Sha256::digest(nonce.to_ascii_lowercase().as_bytes()),
    };
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_le_bytes(first)
}

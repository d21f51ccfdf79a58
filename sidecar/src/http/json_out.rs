//! Response bodies that carry large cached strings (`get`, `mget`), written without serde_json's
//! byte-by-byte escape check: on a 100 x 50 KB mget that check was half of the sidecar's CPU
//! (perf). Runs that need no escaping are found 32 bytes at a time and copied whole; the output
//! is byte for byte what serde_json writes (the tests compare).
//!
//! A large value that needs no escaping is not copied at all: the body is streamed as pieces
//! (the JSON around the values, and each such value's own buffer), so actix copies each piece
//! into its write buffer and sends it while it is still in cache, instead of a 5 MB answer being
//! built whole, copied whole and only then sent (API.md: the answer is checked whole first; its
//! length is known before the first byte).

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use ferry_shared::api::CacheReply;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A value at least this long that needs no escaping goes out as its own piece, uncopied;
/// shorter ones are copied into the JSON around them (a piece costs actix an encode call).
const OWN_PIECE: usize = 4096;

/// A cache command's answer: one buffer (small answers, and any answer whose values were all
/// copied), or pieces streamed in order with the total length known up front.
pub(crate) enum CacheBody {
    Whole(Vec<u8>),
    Pieces(Pieces),
}

/// The JSON body of a cache command's answer.
pub(crate) fn cache_reply(reply: CacheReply) -> CacheBody {
    // The glue's room: each short value, and every value's quotes and comma (a small GET's
    // whole answer in one allocation, as before pieces; a long value is likely a piece).
    let room = |v: &Option<String>| match v {
        Some(s) if s.len() < OWN_PIECE => s.len() + 8,
        _ => 8,
    };
    let size: usize = match &reply {
        CacheReply::Get { value } => room(value),
        CacheReply::Mget { values } => values.iter().map(room).sum(),
        _ => 0,
    };
    let mut out = Builder {
        glue: Vec::with_capacity(size + 32),
        ..Builder::default()
    };
    match reply {
        CacheReply::Get { value } => {
            out.glue.extend_from_slice(br#"{"op":"get","value":"#);
            out.value(value);
        }
        CacheReply::Mget { values } => {
            out.glue.extend_from_slice(br#"{"op":"mget","values":["#);
            for (i, v) in values.into_iter().enumerate() {
                if i > 0 {
                    out.glue.push(b',');
                }
                out.value(v);
            }
            out.glue.push(b']');
        }
        // Small answers: serde_json as everywhere else.
        other => return CacheBody::Whole(serde_json::to_vec(&other).unwrap_or_default()),
    }
    out.glue.push(b'}');
    out.finish()
}

/// Pieces in the making: `glue` is the JSON written since the last uncopied value.
#[derive(Default)]
struct Builder {
    pieces: VecDeque<Bytes>,
    glue: Vec<u8>,
    len: u64,
}

impl Builder {
    fn value(&mut self, v: Option<String>) {
        let Some(s) = v else {
            self.glue.extend_from_slice(b"null");
            return;
        };
        if s.len() < OWN_PIECE || clean_run(s.as_bytes()) < s.len() {
            push_str(&mut self.glue, &s);
            return;
        }
        self.glue.push(b'"');
        self.cut();
        self.len += s.len() as u64;
        self.pieces.push_back(Bytes::from(s.into_bytes()));
        self.glue.push(b'"');
    }

    /// Ends the glue written so far as a piece of its own.
    fn cut(&mut self) {
        let glue = std::mem::take(&mut self.glue);
        self.len += glue.len() as u64;
        self.pieces.push_back(Bytes::from(glue));
    }

    fn finish(mut self) -> CacheBody {
        if self.pieces.is_empty() {
            return CacheBody::Whole(self.glue);
        }
        self.cut();
        CacheBody::Pieces(Pieces {
            pieces: self.pieces,
            len: self.len,
        })
    }
}

/// An answer streamed piece by piece; its length is known, so it goes with `Content-Length`.
pub(crate) struct Pieces {
    pieces: VecDeque<Bytes>,
    len: u64,
}

impl MessageBody for Pieces {
    type Error = Infallible;

    fn size(&self) -> BodySize {
        BodySize::Sized(self.len)
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Infallible>>> {
        Poll::Ready(self.pieces.pop_front().map(Ok))
    }
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
pub(crate) fn push_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.push(b'"');
    let mut at = 0;
    while at < b.len() {
        let clean = clean_run(&b[at..]);
        out.extend_from_slice(&b[at..at + clean]);
        at += clean;
        if let Some(&c) = b.get(at) {
            escape(out, c);
            at += 1;
        }
    }
    out.push(b'"');
}

/// Without short-circuits, so that the chunked check below compiles to SIMD compares.
fn needs_escape(c: u8) -> bool {
    (c < 0x20) | (c == b'"') | (c == b'\\')
}

/// How many leading bytes need no escaping: 32-byte chunks checked whole (no early exit inside
/// one, so the compiler checks a chunk with a few vector compares), then byte by byte from the
/// first chunk that has one.
fn clean_run(b: &[u8]) -> usize {
    let mut i = 0;
    for chunk in b.chunks_exact(32) {
        if chunk
            .iter()
            .fold(false, |dirty, &c| dirty | needs_escape(c))
        {
            break;
        }
        i += 32;
    }
    i + b[i..].iter().take_while(|&&c| !needs_escape(c)).count()
}

fn escape(out: &mut Vec<u8>, c: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match c {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        0x08 => out.extend_from_slice(b"\\b"),
        0x0c => out.extend_from_slice(b"\\f"),
        _ => out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(c >> 4)],
            HEX[usize::from(c & 0xf)],
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(s: &str) -> String {
        let mut out = Vec::new();
        push_str(&mut out, s);
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn strings_come_out_as_serde_json_writes_them() {
        let mut cases: Vec<String> = [
            "",
            "x",
            "plain ascii text that is longer than a word",
            "quote \" backslash \\ slash / tab \t nl \n cr \r bs \u{8} ff \u{c}",
            "\u{0}\u{1}\u{1f}\u{7f} del stays",
            "ünïcödé ✓ 🚀 mixed with \"quotes\"",
            "\"\"\"\"\"\"\"\"\"",
            "aaaaaaa\"",
            "aaaaaaaa\\",
            "aaaaaaaaaaaaaaa\u{1f}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every byte that matters at every offset of a word, among bytes that do not.
        for special in ['"', '\\', '\u{0}', '\u{1f}', '\n', ' ', '~', 'é', '\u{7f}'] {
            for at in 0..17 {
                let mut s = "y".repeat(at);
                s.push(special);
                s.push_str(&"z".repeat(17 - at));
                cases.push(s);
            }
        }
        for s in &cases {
            let theirs = serde_json::to_string(s).expect("serde_json");
            assert_eq!(ours(s), theirs, "{s:?}");
        }
    }

    #[test]
    fn every_byte_at_every_offset_of_long_strings_is_escaped_as_serde_json_does() {
        // Past the 32-byte blocks: each special byte at each offset of a 100-byte string, and
        // the bytes around each kind (0x1f/0x20, 0x21/0x22/0x23, 0x5b/0x5c/0x5d, 0x7f, 0x80+).
        for special in [
            '\u{0}', '\u{1f}', ' ', '!', '"', '#', '[', '\\', ']', '\u{7f}', 'é',
        ] {
            for at in 0..100 {
                let mut s = "a".repeat(at);
                s.push(special);
                s.push_str(&"b".repeat(100 - at));
                let theirs = serde_json::to_string(&s).expect("serde_json");
                assert_eq!(ours(&s), theirs, "{special:?} at {at}");
                assert_eq!(clean_run(s.as_bytes()) == s.len(), !needs_escape_any(&s));
            }
        }
    }

    fn needs_escape_any(s: &str) -> bool {
        s.bytes().any(needs_escape)
    }

    #[test]
    fn cache_replies_match_serde_json() {
        let big = "x".repeat(50 * 1024);
        for reply in [
            CacheReply::Get { value: None },
            CacheReply::Get {
                value: Some("a \"b\"".into()),
            },
            CacheReply::Mget {
                values: vec![Some(big.clone()), None, Some("\n".into())],
            },
            // Uncopied pieces next to each other, first and last; a long value that needs
            // escaping (copied) between them; one just under the piece size.
            CacheReply::Mget {
                values: vec![
                    Some(big.clone()),
                    Some(big.clone()),
                    Some(format!("{big}\"{big}")),
                    Some("y".repeat(OWN_PIECE - 1)),
                    Some("z".repeat(OWN_PIECE)),
                ],
            },
            CacheReply::Get {
                value: Some(big.clone()),
            },
            CacheReply::Mget { values: vec![] },
            CacheReply::Del { deleted: 2 },
        ] {
            let theirs = serde_json::to_vec(&reply).expect("serde_json");
            let ours = match cache_reply(reply) {
                CacheBody::Whole(v) => v,
                CacheBody::Pieces(p) => {
                    let all: Vec<u8> = p.pieces.iter().flat_map(|b| b.to_vec()).collect();
                    assert_eq!(all.len() as u64, p.len, "the length announced");
                    all
                }
            };
            assert_eq!(
                String::from_utf8(ours).expect("utf-8"),
                String::from_utf8(theirs).expect("utf-8")
            );
        }
    }
}

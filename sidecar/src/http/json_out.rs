//! Response bodies that carry large cached strings (`get`, `mget`), written without serde_json's
//! byte-by-byte escape check: on a 100 x 50 KB mget that check was half of the sidecar's CPU
//! (perf). Runs that need no escaping are found 32 bytes at a time and copied whole; the output
//! is byte for byte what serde_json writes (the tests compare).

use ferry_shared::api::CacheReply;

/// The JSON body of a cache command's answer.
pub(crate) fn cache_reply(reply: &CacheReply) -> Vec<u8> {
    let values: &[Option<String>] = match reply {
        CacheReply::Get { value } => std::slice::from_ref(value),
        CacheReply::Mget { values } => values,
        // Small answers: serde_json as everywhere else.
        other => return serde_json::to_vec(other).unwrap_or_default(),
    };
    let size: usize = values.iter().flatten().map(|v| v.len() + 8).sum();
    let mut out = Vec::with_capacity(size + 32);
    let one = |out: &mut Vec<u8>, v: &Option<String>| match v {
        Some(s) => push_str(out, s),
        None => out.extend_from_slice(b"null"),
    };
    match reply {
        CacheReply::Get { value } => {
            out.extend_from_slice(br#"{"op":"get","value":"#);
            one(&mut out, value);
        }
        _ => {
            out.extend_from_slice(br#"{"op":"mget","values":["#);
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                one(&mut out, v);
            }
            out.push(b']');
        }
    }
    out.push(b'}');
    out
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
            CacheReply::Mget { values: vec![] },
            CacheReply::Del { deleted: 2 },
        ] {
            let theirs = serde_json::to_vec(&reply).expect("serde_json");
            assert_eq!(
                String::from_utf8(cache_reply(&reply)).expect("utf-8"),
                String::from_utf8(theirs).expect("utf-8")
            );
        }
    }
}

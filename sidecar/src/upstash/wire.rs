//! Redis's wire protocol (RESP2) for the Upstash door, read within a byte budget.
//!
//! A command's reply can be far larger than the command (`GETRANGE big 0 -1`: 45 bytes in,
//! 3.2 GB out), and a client library reads a reply whole before looking at it. So the door reads
//! its replies itself: every length Redis declares is checked against what is left of the
//! request's budget (`limits.max_read_bytes`) before anything is allocated for it, and the
//! whole pipeline shares one budget. A reply past it ends the connection (its framing is lost),
//! and the caller is told which limit it met: the caller's doing, never Redis's.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// One reply, as RESP2 has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    /// A simple string (`+OK`, `+PONG`, `+string` from TYPE).
    Status(String),
    /// An error reply (`-ERR ...`): the command's own answer, not a failure of the exchange.
    Error(String),
    Array(Vec<Reply>),
}

/// Why an exchange gave no replies.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// The replies would pass the budget: the connection is closed, Redis is fine.
    #[error("the reply is larger than {0} bytes")]
    TooLarge(usize),
    #[error("redis: {0}")]
    Io(#[from] std::io::Error),
    #[error("redis sent what is not RESP: {0}")]
    Protocol(&'static str),
}

/// Deeper than any reply of the commands the door runs (`XINFO STREAM ... FULL` is about 6).
const MAX_DEPTH: usize = 16;
/// The longest header line (`$`, `*`, `:`) or simple string accepted.
const MAX_LINE: usize = 64 * 1024;

/// Commands in RESP (an array of bulk strings each), appended to `out`.
pub(crate) fn encode(commands: &[&[Vec<u8>]], out: &mut Vec<u8>) {
    for args in commands {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in *args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Reads one reply, taking what it uses from `budget` (bytes of the wire).
pub(crate) async fn read<R: AsyncBufRead + Unpin>(
    r: &mut R,
    budget: &mut usize,
    limit: usize,
) -> Result<Reply, WireError> {
    // Iterative: each open array is a frame of (items so far, items expected).
    let mut stack: Vec<(Vec<Reply>, usize)> = Vec::new();
    loop {
        let line = read_line(r, budget, limit).await?;
        let (kind, rest) = line
            .split_first()
            .ok_or(WireError::Protocol("an empty line"))?;
        let text = std::str::from_utf8(rest).map_err(|_| WireError::Protocol("not UTF-8"))?;
        let mut done = match kind {
            b'+' => Reply::Status(text.to_string()),
            b'-' => Reply::Error(text.to_string()),
            b':' => Reply::Int(number(text)?),
            b'$' => match number(text)? {
                -1 => Reply::Nil,
                n if n < 0 => return Err(WireError::Protocol("a negative length")),
                n => {
                    let n = n as usize;
                    take(budget, n + 2, limit)?;
                    let mut value = vec![0u8; n + 2];
                    r.read_exact(&mut value).await?;
                    if !value.ends_with(b"\r\n") {
                        return Err(WireError::Protocol("a bulk string without its CRLF"));
                    }
                    value.truncate(n);
                    Reply::Bulk(value)
                }
            },
            b'*' => match number(text)? {
                -1 => Reply::Nil,
                n if n < 0 => return Err(WireError::Protocol("a negative length")),
                0 => Reply::Array(Vec::new()),
                n => {
                    // Each item takes at least 3 bytes of the wire: a count past the budget
                    // cannot be honest, and is refused before anything is allocated.
                    let n = n as usize;
                    if n.saturating_mul(3) > *budget {
                        return Err(WireError::TooLarge(limit));
                    }
                    if stack.len() >= MAX_DEPTH {
                        return Err(WireError::Protocol("nested too deep"));
                    }
                    stack.push((Vec::with_capacity(n.min(1024)), n));
                    continue;
                }
            },
            _ => return Err(WireError::Protocol("an unknown reply type")),
        };
        // Put the finished reply into its array, closing every array it completes.
        loop {
            let Some((items, expected)) = stack.last_mut() else {
                return Ok(done);
            };
            items.push(done);
            if items.len() < *expected {
                break;
            }
            let (items, _) = stack.pop().unwrap_or_default();
            done = Reply::Array(items);
        }
    }
}

fn take(budget: &mut usize, n: usize, limit: usize) -> Result<(), WireError> {
    *budget = budget.checked_sub(n).ok_or(WireError::TooLarge(limit))?;
    Ok(())
}

fn number(text: &str) -> Result<i64, WireError> {
    text.parse()
        .map_err(|_| WireError::Protocol("not a number"))
}

/// One line without its CRLF, within the budget and `MAX_LINE`.
async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    budget: &mut usize,
    limit: usize,
) -> Result<Vec<u8>, WireError> {
    let mut line = Vec::new();
    let mut limited = r.take(MAX_LINE as u64 + 2);
    let n = limited.read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Err(WireError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    take(budget, n, limit)?;
    if !line.ends_with(b"\r\n") {
        return Err(WireError::Protocol("a line without its CRLF, or too long"));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8], budget: usize) -> Result<Vec<Reply>, WireError> {
        let mut r = tokio::io::BufReader::new(bytes);
        let mut left = budget;
        let mut out = Vec::new();
        while out.len() < 2 {
            out.push(read(&mut r, &mut left, budget).await?);
        }
        Ok(out)
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn replies_are_read_whole_and_in_order() {
        let wire = b"*3\r\n$2\r\nhi\r\n*2\r\n:7\r\n$-1\r\n+OK\r\n-ERR no\r\n";
        let got = run(parse(wire, 1000)).expect("parses");
        assert_eq!(
            got,
            vec![
                Reply::Array(vec![
                    Reply::Bulk(b"hi".to_vec()),
                    Reply::Array(vec![Reply::Int(7), Reply::Nil]),
                    Reply::Status("OK".into()),
                ]),
                Reply::Error("ERR no".into()),
            ]
        );
    }

    #[test]
    fn a_declared_length_past_the_budget_is_refused_before_it_is_read() {
        // 3 GB declared, nothing behind it: refused at once, nothing allocated.
        let wire = b"$3000000000\r\n";
        assert!(matches!(
            run(parse(wire, 1_000_000)),
            Err(WireError::TooLarge(1_000_000))
        ));
        let wire = b"*1000000000\r\n";
        assert!(matches!(
            run(parse(wire, 1_000_000)),
            Err(WireError::TooLarge(_))
        ));
        // Many small replies share one budget.
        let mut wire = Vec::new();
        encode(&[&[b"x".repeat(400)], &[b"y".repeat(400)]], &mut wire);
        assert!(matches!(
            run(parse(&wire, 600)),
            Err(WireError::TooLarge(_))
        ));
    }

    #[test]
    fn commands_are_encoded_as_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(
            &[&[b"SET".to_vec(), b"k".to_vec(), b"v\r\n".to_vec()]],
            &mut out,
        );
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n");
    }
}

//! What one command may make Redis allocate or send, checked before it is sent.
//!
//! A few commands turn a few bytes into a lot: `SETRANGE k 536870911 x` makes a 512 MB string,
//! `SETBIT k 4294967295 1` another, `BITFIELD` the same through its offsets, and the random
//! member commands with a negative count repeat members as often as asked. Each is held to what
//! the door could read back (`limits.max_read_bytes` for a value, `limits.max_read_rows` for a
//! count); anything larger is refused with Redis's own style of error, before Redis sees it.
//! Commands that reach another database (`MOVE`, `COPY ... DB`) are refused outright: a token's
//! keys are its namespace, in the door's database.

use super::Refused;

/// The bounds in force for one request.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Largest value a command may make (bytes).
    pub max_bytes: usize,
    /// Largest count of items a command may ask for.
    pub max_items: usize,
}

/// What `args` may make Redis allocate beyond what it carries, in bytes (0 for most
/// commands), or why it is refused. A request's commands together are held to the same bound
/// (`Commands::prepare`'s caller sums them): a hundred SETBITs in one pipeline are one request.
pub(super) fn check(name: &str, args: &[Vec<u8>], b: Bounds) -> Result<usize, Refused> {
    let made = made_by(name, args, b)?;
    if made > b.max_bytes as u128 {
        return Err(Refused(format!(
            "ERR the value {name} would make is past what this door allows \
             (limits.max_read_bytes: {} bytes)",
            b.max_bytes
        )));
    }
    Ok(made as usize)
}

fn made_by(name: &str, args: &[Vec<u8>], b: Bounds) -> Result<u128, Refused> {
    let int = |i: usize| -> Option<i64> {
        std::str::from_utf8(args.get(i)?)
            .ok()?
            .trim()
            .parse::<i64>()
            .ok()
    };
    // Unreadable offsets count as past the bound (Redis would refuse them anyway).
    let offset = |i: usize| -> u128 {
        std::str::from_utf8(args.get(i).map_or(&[][..], Vec::as_slice))
            .ok()
            .and_then(|o| o.trim().parse::<u128>().ok())
            .unwrap_or(u128::MAX)
    };
    match name {
        // Its cost grows with the product of the two strings' lengths: two 11 KB values kept
        // Redis busy 0.7 s a call, and a pipeline of them for minutes.
        "lcs" => Err(Refused(
            "ERR Command is not allowed: lcs (its cost grows with the product of the strings' \
             lengths)"
                .into(),
        )),
        "move" => Err(Refused(
            "ERR Command is not allowed: move (another database)".into(),
        )),
        "copy" if args.iter().skip(3).any(|a| a.eq_ignore_ascii_case(b"db")) => Err(Refused(
            "ERR Command is not allowed: copy to another database".into(),
        )),
        "setrange" => Ok(offset(2).saturating_add(args.get(3).map_or(0, Vec::len) as u128)),
        "setbit" => Ok(offset(2) / 8 + 1),
        "bitfield" | "bitfield_ro" => {
            // Every OFFSET after a subcommand's type: a number, or #n (n times the type's width).
            let mut most = 0u128;
            let mut i = 2;
            while i < args.len() {
                let sub = String::from_utf8_lossy(&args[i]).to_ascii_lowercase();
                let step = match sub.as_str() {
                    "get" => 3,
                    "set" | "incrby" => 4,
                    "overflow" => 2,
                    _ => 1,
                };
                if matches!(sub.as_str(), "get" | "set" | "incrby") {
                    let width: u128 = args
                        .get(i + 1)
                        .and_then(|t| std::str::from_utf8(&t[1.min(t.len())..]).ok())
                        .and_then(|w| w.parse().ok())
                        .unwrap_or(64);
                    let bits = args
                        .get(i + 2)
                        .and_then(|o| std::str::from_utf8(o).ok())
                        .map_or(u128::MAX, |o| match o.strip_prefix('#') {
                            Some(n) => n.parse::<u128>().unwrap_or(u128::MAX).saturating_mul(width),
                            None => o.parse::<u128>().unwrap_or(u128::MAX),
                        });
                    most = most.max(bits.saturating_add(width) / 8 + 1);
                }
                i += step;
            }
            Ok(most)
        }
        "srandmember" | "zrandmember" | "hrandfield" | "spop" | "lpop" | "rpop" => match int(2) {
            Some(n) if n.unsigned_abs() > b.max_items as u64 => Err(Refused(format!(
                "ERR the count is past what this door allows (limits.max_read_rows: {})",
                b.max_items
            ))),
            _ => Ok(0),
        },
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<Vec<u8>> {
        a.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    const B: Bounds = Bounds {
        max_bytes: 4 * 1024 * 1024,
        max_items: 10_000,
    };

    #[test]
    fn amplifying_arguments_are_refused_and_ordinary_ones_pass() {
        for (name, a) in [
            ("setrange", &["SETRANGE", "k", "536870911", "x"][..]),
            ("setbit", &["SETBIT", "k", "4294967295", "1"][..]),
            (
                "bitfield",
                &["BITFIELD", "k", "SET", "u8", "#600000000", "1"][..],
            ),
            (
                "bitfield",
                &["BITFIELD", "k", "GET", "i64", "99999999999"][..],
            ),
            ("srandmember", &["SRANDMEMBER", "k", "-100000000"][..]),
            (
                "hrandfield",
                &["HRANDFIELD", "k", "50000", "WITHVALUES"][..],
            ),
            ("move", &["MOVE", "k", "1"][..]),
            ("copy", &["COPY", "a", "b", "DB", "5", "REPLACE"][..]),
            ("lcs", &["LCS", "a", "b", "LEN"][..]),
            // Offsets that would overflow, or are not numbers: refused, never a panic.
            ("bitfield_ro", &["BITFIELD_RO", "k", "GET", "u8", "-1"][..]),
            ("bitfield", &["BITFIELD", "k", "GET", "u8", "#x"][..]),
            ("bitfield", &["BITFIELD", "k", "GET", "u8", "#-1"][..]),
            (
                "bitfield",
                &[
                    "BITFIELD",
                    "k",
                    "GET",
                    "u64",
                    "#340282366920938463463374607431768211455",
                ][..],
            ),
            (
                "bitfield",
                &[
                    "BITFIELD",
                    "k",
                    "GET",
                    "u64",
                    "340282366920938463463374607431768211455",
                ][..],
            ),
            ("setbit", &["SETBIT", "k", "x", "1"][..]),
        ] {
            assert!(check(name, &args(a), B).is_err(), "{a:?}");
        }
        for (name, a) in [
            ("setrange", &["SETRANGE", "k", "10", "hello"][..]),
            ("setbit", &["SETBIT", "k", "7", "1"][..]),
            (
                "bitfield",
                &["BITFIELD", "k", "INCRBY", "u8", "#3", "1"][..],
            ),
            ("srandmember", &["SRANDMEMBER", "k", "-5"][..]),
            ("copy", &["COPY", "a", "b", "REPLACE"][..]),
        ] {
            assert!(check(name, &args(a), B).is_ok(), "{a:?}");
        }
    }
}

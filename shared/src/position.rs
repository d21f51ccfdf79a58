//! A position in Postgres's write-ahead log: what a write returns and a later read may carry
//! (`after`), so that it is served only by a replica that has replayed that far, or by the
//! primary (read-your-writes).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A WAL position (an LSN), written as Postgres prints one: two hex numbers of up to 8 digits
/// each, `X/Y` (`16/B374D848`). Later positions compare greater.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position(pub u64);

/// Why a position did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPosition;

impl fmt::Display for BadPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a position is two hex numbers of up to 8 digits, X/Y (as `position` returns)")
    }
}

impl std::error::Error for BadPosition {}

impl FromStr for Position {
    type Err = BadPosition;

    fn from_str(s: &str) -> Result<Position, BadPosition> {
        let (hi, lo) = s.split_once('/').ok_or(BadPosition)?;
        let half = |h: &str| {
            if h.is_empty() || h.len() > 8 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(BadPosition);
            }
            u32::from_str_radix(h, 16).map_err(|_| BadPosition)
        };
        Ok(Position(
            (u64::from(half(hi)?) << 32) | u64::from(half(lo)?),
        ))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl Serialize for Position {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Position {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Position, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_read_and_print_as_postgres_does() {
        for s in ["0/0", "0/16B3748", "16/B374D848", "FFFFFFFF/FFFFFFFF"] {
            let p: Position = s.parse().expect(s);
            assert_eq!(p.to_string(), s);
        }
        assert_eq!("1/0".parse::<Position>(), Ok(Position(1 << 32)));
        assert_eq!("0/a".parse::<Position>(), Ok(Position(10)));
        assert!(Position(0x16B3748) < "1/0".parse::<Position>().expect("valid"));
    }

    #[test]
    fn anything_else_is_refused() {
        for s in [
            "",
            "/",
            "0/",
            "/0",
            "0",
            "0/0/0",
            "g/0",
            "0/-1",
            "+1/0",
            "123456789/0",
            " 0/0",
        ] {
            assert_eq!(s.parse::<Position>(), Err(BadPosition), "{s:?}");
        }
        let json: Result<Position, _> = serde_json::from_str("12");
        assert!(json.is_err());
        let json: Position = serde_json::from_str("\"A/B\"").expect("valid");
        assert_eq!(json, Position(0xA_0000_000B));
    }
}

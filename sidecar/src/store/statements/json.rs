//! Postgres values (binary wire format) to JSON, faithfully:
//!
//! | Postgres | JSON |
//! |---|---|
//! | NULL | null |
//! | bool | true / false |
//! | int2, int4, oid | number |
//! | int8 | number; a string beyond ±(2^53-1), where JSON numbers lose precision |
//! | float4, float8 | number; "NaN", "Infinity", "-Infinity" as strings |
//! | numeric | string, every digit kept ("NaN", "Infinity" too) |
//! | text, varchar, char(n), name, citext-like enums | string |
//! | json, jsonb | the JSON value itself |
//! | uuid | string, hyphenated lowercase |
//! | date | "YYYY-MM-DD" |
//! | time | "HH:MM:SS[.ffffff]" |
//! | timestamp | "YYYY-MM-DDTHH:MM:SS[.ffffff]" |
//! | timestamptz | "YYYY-MM-DDTHH:MM:SS[.ffffff]Z" (UTC) |
//! | bytea | string, standard base64 |
//! | arrays of these | arrays, nested for more dimensions |
//! | domains | as their base type |
//!
//! Anything else is refused by name (see [`check_supported`]) before any row is read.

use base64::Engine;
use chrono::{Duration as ChronoDuration, NaiveDate, NaiveDateTime, NaiveTime};
use postgres_protocol::types as pg;
use postgres_types::{FromSql, Kind, Type};
use serde_json::{Number, Value};

/// Largest integer a JSON number (an IEEE double) holds exactly.
const MAX_SAFE_INT: i64 = (1 << 53) - 1;

/// A column value as the raw bytes Postgres sent; decoded by [`to_json`].
pub(crate) struct Raw<'a>(pub Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(
        _ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(Some(raw)))
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(None))
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("unsupported type {0}")]
    Unsupported(String),
    #[error("cannot decode {ty}: {message}")]
    Invalid { ty: String, message: String },
}

/// Ok if values of `ty` can be mapped to JSON; otherwise the name of the type at fault.
pub(crate) fn check_supported(ty: &Type) -> Result<(), String> {
    match ty.kind() {
        Kind::Array(member) => check_supported(member),
        Kind::Domain(base) => check_supported(base),
        Kind::Enum(_) => Ok(()),
        _ if is_scalar_supported(ty) => Ok(()),
        _ => Err(ty.name().to_string()),
    }
}

fn is_scalar_supported(ty: &Type) -> bool {
    matches!(
        *ty,
        Type::BOOL
            | Type::INT2
            | Type::INT4
            | Type::INT8
            | Type::OID
            | Type::FLOAT4
            | Type::FLOAT8
            | Type::NUMERIC
            | Type::TEXT
            | Type::VARCHAR
            | Type::BPCHAR
            | Type::NAME
            | Type::UNKNOWN
            | Type::JSON
            | Type::JSONB
            | Type::UUID
            | Type::DATE
            | Type::TIME
            | Type::TIMESTAMP
            | Type::TIMESTAMPTZ
            | Type::BYTEA
    )
}

fn invalid(ty: &Type, e: impl std::fmt::Display) -> DecodeError {
    DecodeError::Invalid {
        ty: ty.name().to_string(),
        message: e.to_string(),
    }
}

/// Decodes one value of type `ty`.
pub(crate) fn to_json(ty: &Type, raw: Option<&[u8]>) -> Result<Value, DecodeError> {
    let Some(buf) = raw else {
        return Ok(Value::Null);
    };
    match ty.kind() {
        Kind::Array(member) => return array_to_json(ty, member, buf),
        Kind::Domain(base) => return to_json(base, raw),
        Kind::Enum(_) => return text(ty, buf),
        _ => {}
    }
    let e = |err| invalid(ty, err);
    Ok(match *ty {
        Type::BOOL => Value::Bool(pg::bool_from_sql(buf).map_err(e)?),
        Type::INT2 => Value::from(pg::int2_from_sql(buf).map_err(e)?),
        Type::INT4 => Value::from(pg::int4_from_sql(buf).map_err(e)?),
        Type::OID => Value::from(pg::oid_from_sql(buf).map_err(e)?),
        Type::INT8 => {
            let v = pg::int8_from_sql(buf).map_err(e)?;
            if (-MAX_SAFE_INT..=MAX_SAFE_INT).contains(&v) {
                Value::from(v)
            } else {
                Value::String(v.to_string())
            }
        }
        Type::FLOAT4 => float(f64::from(pg::float4_from_sql(buf).map_err(e)?)),
        Type::FLOAT8 => float(pg::float8_from_sql(buf).map_err(e)?),
        Type::NUMERIC => Value::String(numeric_to_string(buf).map_err(|m| invalid(ty, m))?),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            return text(ty, buf)
        }
        Type::JSON => serde_json::from_slice(buf).map_err(e_json(ty))?,
        Type::JSONB => match buf.split_first() {
            Some((1, json)) => serde_json::from_slice(json).map_err(e_json(ty))?,
            _ => return Err(invalid(ty, "unknown jsonb version")),
        },
        Type::UUID => Value::String(uuid_string(&pg::uuid_from_sql(buf).map_err(e)?)),
        Type::DATE => Value::String(date_string(pg::date_from_sql(buf).map_err(e)?)),
        Type::TIME => Value::String(time_string(pg::time_from_sql(buf).map_err(e)?)),
        Type::TIMESTAMP => Value::String(timestamp_string(
            pg::timestamp_from_sql(buf).map_err(e)?,
            "",
        )),
        Type::TIMESTAMPTZ => Value::String(timestamp_string(
            pg::timestamp_from_sql(buf).map_err(e)?,
            "Z",
        )),
        Type::BYTEA => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(pg::bytea_from_sql(buf)))
        }
        _ => return Err(DecodeError::Unsupported(ty.name().to_string())),
    })
}

fn e_json(ty: &Type) -> impl Fn(serde_json::Error) -> DecodeError + '_ {
    move |err| invalid(ty, err)
}

fn text(ty: &Type, buf: &[u8]) -> Result<Value, DecodeError> {
    pg::text_from_sql(buf)
        .map(|s| Value::String(s.to_string()))
        .map_err(|err| invalid(ty, err))
}

fn float(v: f64) -> Value {
    match Number::from_f64(v) {
        Some(n) => Value::Number(n),
        None if v.is_nan() => Value::String("NaN".into()),
        None if v > 0.0 => Value::String("Infinity".into()),
        None => Value::String("-Infinity".into()),
    }
}

fn array_to_json(ty: &Type, member: &Type, buf: &[u8]) -> Result<Value, DecodeError> {
    use fallible_iterator::FallibleIterator;
    let array = pg::array_from_sql(buf).map_err(|err| invalid(ty, err))?;
    let dims: Vec<usize> = array
        .dimensions()
        .map(|d| Ok(d.len.max(0) as usize))
        .collect()
        .map_err(|err| invalid(ty, err))?;
    let mut values = Vec::new();
    let mut it = array.values();
    while let Some(v) = it.next().map_err(|err| invalid(ty, err))? {
        values.push(to_json(member, v)?);
    }
    if dims.is_empty() {
        return Ok(Value::Array(Vec::new()));
    }
    Ok(nest(&dims, &mut values.into_iter()))
}

/// Rebuilds the nesting of a multi-dimensional array from its flat, row-major values.
fn nest(dims: &[usize], values: &mut impl Iterator<Item = Value>) -> Value {
    match dims.split_first() {
        Some((&n, [])) => Value::Array(values.take(n).collect()),
        Some((&n, rest)) => Value::Array((0..n).map(|_| nest(rest, values)).collect()),
        None => Value::Null,
    }
}

fn uuid_string(b: &[u8; 16]) -> String {
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn pg_epoch() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(2000, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or_default()
}

fn date_string(days: i32) -> String {
    match days {
        i32::MAX => "infinity".into(),
        i32::MIN => "-infinity".into(),
        d => pg_epoch()
            .date()
            .checked_add_signed(ChronoDuration::days(i64::from(d)))
            .map_or_else(|| d.to_string(), |date| date.format("%Y-%m-%d").to_string()),
    }
}

fn time_string(micros: i64) -> String {
    let secs = (micros / 1_000_000) as u32;
    let nanos = ((micros % 1_000_000) * 1_000) as u32;
    NaiveTime::from_num_seconds_from_midnight_opt(secs, nanos).map_or_else(
        || micros.to_string(),
        |t| t.format("%H:%M:%S%.f").to_string(),
    )
}

fn timestamp_string(micros: i64, suffix: &str) -> String {
    match micros {
        i64::MAX => "infinity".into(),
        i64::MIN => "-infinity".into(),
        m => pg_epoch()
            .checked_add_signed(ChronoDuration::microseconds(m))
            .map_or_else(
                || m.to_string(),
                |t| format!("{}{suffix}", t.format("%Y-%m-%dT%H:%M:%S%.f")),
            ),
    }
}

/// Renders Postgres' binary numeric exactly as Postgres' own `numeric_out` does.
///
/// Layout: ndigits i16, weight i16 (of the first base-10000 digit), sign u16, dscale u16
/// (digits after the point), then ndigits base-10000 digits.
pub(crate) fn numeric_to_string(buf: &[u8]) -> Result<String, String> {
    let word = |i: usize| -> Result<u16, String> {
        buf.get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "numeric value is truncated".to_string())
    };
    let ndigits = word(0)? as usize;
    let weight = word(2)? as i16 as i64;
    let sign = word(4)?;
    let dscale = word(6)? as usize;
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => return Err(format!("unknown numeric sign {sign:#x}")),
    }
    let digits: Vec<u16> = (0..ndigits)
        .map(|i| word(8 + 2 * i))
        .collect::<Result<_, _>>()?;
    let digit = |idx: i64| -> u16 {
        usize::try_from(idx)
            .ok()
            .and_then(|i| digits.get(i).copied())
            .unwrap_or(0)
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for idx in 0..=weight {
            if idx == 0 {
                out.push_str(&digit(idx).to_string());
            } else {
                out.push_str(&format!("{:04}", digit(idx)));
            }
        }
    }
    if dscale > 0 {
        let mut frac = String::with_capacity(dscale + 4);
        let mut idx = weight + 1;
        while frac.len() < dscale {
            frac.push_str(&format!("{:04}", digit(idx)));
            idx += 1;
        }
        frac.truncate(dscale);
        out.push('.');
        out.push_str(&frac);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((digits.len() as u16).to_be_bytes());
        b.extend(weight.to_be_bytes());
        b.extend(sign.to_be_bytes());
        b.extend(dscale.to_be_bytes());
        for d in digits {
            b.extend(d.to_be_bytes());
        }
        b
    }

    #[test]
    fn numeric_rendering() {
        let cases: &[(i16, u16, u16, &[u16], &str)] = &[
            (1, 0, 3, &[1, 2345, 6780], "12345.678"),
            (-1, 0, 4, &[1], "0.0001"),
            (0, 0, 2, &[], "0.00"),
            (5, 0, 0, &[1], "100000000000000000000"),
            (0, 0x4000, 1, &[7, 5000], "-7.5"),
            (-2, 0, 6, &[1200], "0.000012"),
            (-2, 0, 8, &[12], "0.00000012"),
            (0, 0xC000, 0, &[], "NaN"),
        ];
        for (weight, sign, dscale, digits, want) in cases {
            let got = numeric_to_string(&numeric(*weight, *sign, *dscale, digits)).expect("ok");
            assert_eq!(&got, want);
        }
        assert!(numeric_to_string(&[0, 1]).is_err());
    }

    #[test]
    fn nesting_follows_dimensions() {
        let values = (1..=6).map(Value::from).collect::<Vec<_>>();
        let v = nest(&[2, 3], &mut values.into_iter());
        assert_eq!(v, serde_json::json!([[1, 2, 3], [4, 5, 6]]));
    }

    #[test]
    fn int8_beyond_2_53_is_a_string() {
        let big = (1i64 << 53).to_be_bytes();
        assert_eq!(
            to_json(&Type::INT8, Some(&big)).expect("ok"),
            Value::String("9007199254740992".into())
        );
        let small = MAX_SAFE_INT.to_be_bytes();
        assert_eq!(
            to_json(&Type::INT8, Some(&small)).expect("ok"),
            Value::from(MAX_SAFE_INT)
        );
    }
}

//! The demo's `POST /items/:id/reprice`: its input, and the arithmetic the Worker does between
//! reading a price and writing the new one (exact, in cents, as `numeric(10, 2)` holds it).

use ferry_edge::EdgeError;
use serde::Deserialize;

/// The sidecar's named statement that reads an item's price under a row lock.
pub const PRICE_FOR_UPDATE_QUERY: &str = "item_for_update";
/// The sidecar's named statement that sets an item's price.
pub const SET_PRICE_QUERY: &str = "set_price";
/// The largest change one reprice may make, in percent either way (down to half, up to double).
pub const MAX_PERCENT: i64 = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RepriceBody {
    percent: i64,
}

/// `{"percent": 10}`: a whole percentage from -50 to +100.
pub fn parse_reprice(body: &[u8]) -> Result<i64, EdgeError> {
    let b: RepriceBody = serde_json::from_slice(body)
        .map_err(|e| EdgeError::bad_request(format!("expected {{\"percent\": integer}}: {e}")))?;
    if !(-50..=MAX_PERCENT).contains(&b.percent) || b.percent == 0 {
        return Err(EdgeError::invalid(
            "percent",
            format!("a whole number from -50 to {MAX_PERCENT}, not 0"),
        ));
    }
    Ok(b.percent)
}

/// `price` ("8.75", as Postgres prints a `numeric(10, 2)`) changed by `percent`, rounded half
/// up to the cent. Anything else in `price` is the sidecar's data, not the caller's fault.
pub fn repriced(price: &str, percent: i64) -> Result<String, EdgeError> {
    let cents = to_cents(price).ok_or_else(|| {
        EdgeError::Misconfigured(format!("a price that is not a decimal: {price:?}"))
    })?;
    let scaled = cents * (100 + percent);
    let new = (scaled + 50).div_euclid(100);
    Ok(format!("{}.{:02}", new / 100, new % 100))
}

/// The largest price `numeric(10, 2)` holds, in cents.
pub const MAX_CENTS: i64 = 9_999_999_999;

/// A plain non-negative decimal (`12`, `12.5`, `12.50`) in cents; None for anything else
/// (signs, exponents, NaN, more than two decimals).
pub fn to_cents(price: &str) -> Option<i64> {
    let (whole, frac) = price.split_once('.').unwrap_or((price, "0"));
    if whole.is_empty() || whole.len() > 12 || frac.is_empty() || frac.len() > 2 {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let frac: i64 = format!("{frac:0<2}").parse().ok()?;
    Some(whole * 100 + frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reprices_in_whole_cents() {
        assert_eq!(repriced("100.00", 10).as_deref(), Ok("110.00"));
        assert_eq!(
            repriced("8.75", 10).as_deref(),
            Ok("9.63"),
            "9.625 rounds up"
        );
        assert_eq!(repriced("8.75", -50).as_deref(), Ok("4.38"));
        assert_eq!(repriced("0.05", 10).as_deref(), Ok("0.06"));
        assert_eq!(repriced("12", 100).as_deref(), Ok("24.00"));
        assert_eq!(repriced("1.5", 10).as_deref(), Ok("1.65"));
        for bad in [
            "", "x", "1.234", "-1.00", ".5", "1.", "+1", "1e3", "NaN", "inf",
        ] {
            assert!(repriced(bad, 10).is_err(), "{bad}");
        }
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_reprice(br#"{"percent": 10}"#), Ok(10));
        assert_eq!(parse_reprice(br#"{"percent": -50}"#), Ok(-50));
        for bad in [
            &br#"{"percent": 0}"#[..],
            br#"{"percent": -51}"#,
            br#"{"percent": 101}"#,
            br#"{"percent": 1.5}"#,
            br#"{"percent": 1, "x": 1}"#,
            b"{}",
        ] {
            let e = parse_reprice(bad).expect_err("refused");
            assert_eq!(e.status(), 400);
        }
    }
}

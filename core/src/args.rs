//! Command arguments -> a typed, validated request.

use crate::bucket::Limit;
use crate::error::TbError;
use crate::number::{parse_decimal, Sign, MAX_EXACT_INTEGER};

/// `capacity rate [n]` of TB.TAKE / TB.PEEK, validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    pub limit: Limit,
    /// Tokens to take; finite and >= 0.
    pub n: f64,
}

/// Parses the numbers after the key. `n` is `None` where it may be left out
/// (TB.PEEK), and then means 1. Arguments are checked in order, so the error
/// names the first bad one.
pub fn parse_request(capacity: &[u8], rate: &[u8], n: Option<&[u8]>) -> Result<Request, TbError> {
    let capacity = positive(capacity).ok_or(TbError::Capacity)?;
    if capacity > MAX_EXACT_INTEGER as f64 {
        return Err(TbError::CapacityTooLarge);
    }
    let refill_per_sec = positive(rate).ok_or(TbError::Rate)?;
    let n = match n {
        Some(text) => parse_decimal(text, Sign::Forbidden).ok_or(TbError::Count)?,
        None => 1.0,
    };
    if n > MAX_EXACT_INTEGER as f64 {
        return Err(TbError::CountTooLarge);
    }
    Ok(Request {
        limit: Limit {
            capacity,
            refill_per_sec,
        },
        n,
    })
}

/// The `timeout_ms` of TB.BTAKE and TB.ACQUIRE: how long to wait at most,
/// in whole ms (a fraction rounds up), 0 for no limit, at most 2^53.
pub fn parse_timeout(text: &[u8]) -> Result<i64, TbError> {
    let timeout_ms = parse_decimal(text, Sign::Forbidden)
        .filter(|ms| *ms <= MAX_EXACT_INTEGER as f64)
        .ok_or(TbError::Timeout)?;
    // In [0, 2^53]: the conversion is exact.
    Ok(timeout_ms.ceil() as i64)
}

/// TB.ACQUIRE's `limit`: leases live at once, a whole number in [1, 2^53].
pub fn parse_limit(text: &[u8]) -> Result<i64, TbError> {
    whole(text).ok_or(TbError::Limit)
}

/// `lease_ms` of TB.ACQUIRE and TB.RENEW: a whole number of ms in [1, 2^53].
pub fn parse_lease_ms(text: &[u8]) -> Result<i64, TbError> {
    whole(text).ok_or(TbError::LeaseMs)
}

/// Plain decimal digits (leading zeros allowed, no sign, fraction or
/// exponent), at most 64 bytes, valued from 1 to 2^53.
fn whole(text: &[u8]) -> Option<i64> {
    if text.is_empty() || text.len() > 64 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: i64 = 0;
    for digit in text {
        value = value
            .checked_mul(10)?
            .checked_add(i64::from(digit.wrapping_sub(b'0')))?;
        if value > MAX_EXACT_INTEGER {
            return None;
        }
    }
    (value >= 1).then_some(value)
}

fn positive(text: &[u8]) -> Option<f64> {
    parse_decimal(text, Sign::Forbidden).filter(|value| *value > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(c: &str, r: &str, n: &str) -> Result<Request, TbError> {
        parse_request(c.as_bytes(), r.as_bytes(), Some(n.as_bytes()))
    }

    #[test]
    fn it_parses_a_valid_request() {
        let req = parse("20", "2.5", "1e0").unwrap();
        assert_eq!(req.limit.capacity, 20.0);
        assert_eq!(req.limit.refill_per_sec, 2.5);
        assert_eq!(req.n, 1.0);
    }

    #[test]
    fn n_defaults_to_one_where_optional() {
        let req = parse_request(b"5", b"1", None).unwrap();
        assert_eq!(req.n, 1.0);
    }

    #[test]
    fn n_may_be_zero_but_capacity_and_rate_may_not() {
        assert!(parse("1", "1", "0").is_ok());
        assert_eq!(parse("0", "1", "1"), Err(TbError::Capacity));
        assert_eq!(parse("1", "0.0", "1"), Err(TbError::Rate));
        assert_eq!(parse("1e-400", "1", "1"), Err(TbError::Capacity));
    }

    #[test]
    fn capacity_and_n_may_reach_but_not_pass_2_pow_53() {
        assert!(parse("9007199254740992", "1", "9007199254740992").is_ok());
        assert_eq!(
            parse("9007199254740993.5", "1", "1"),
            Err(TbError::CapacityTooLarge)
        );
        assert_eq!(parse("1e300", "1", "1"), Err(TbError::CapacityTooLarge));
        assert_eq!(parse("1", "1", "1e16"), Err(TbError::CountTooLarge));
        // The rate has no such bound: a huge rate refills at once.
        assert!(parse("1", "1e300", "1").is_ok());
    }

    #[test]
    fn a_timeout_is_whole_ms_from_zero_to_2_pow_53() {
        assert_eq!(parse_timeout(b"0"), Ok(0));
        assert_eq!(parse_timeout(b"1500"), Ok(1500));
        assert_eq!(parse_timeout(b"0.25"), Ok(1));
        assert_eq!(parse_timeout(b"9007199254740992"), Ok(1 << 53));
        for bad in ["-1", "1e16", "x", "", "inf", " 1"] {
            assert_eq!(
                parse_timeout(bad.as_bytes()),
                Err(TbError::Timeout),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_first_bad_argument_is_named() {
        assert_eq!(parse("x", "y", "z"), Err(TbError::Capacity));
        assert_eq!(parse("1", "y", "z"), Err(TbError::Rate));
        assert_eq!(parse("1", "1", "z"), Err(TbError::Count));
    }

    #[test]
    fn every_bad_number_is_rejected_for_every_argument() {
        let long = "9".repeat(65);
        for bad in [
            "nan", "inf", "-1", "0x10", "", " 5", "1e400", "-0", "+1", "1 ", &long,
        ] {
            assert_eq!(parse(bad, "1", "1"), Err(TbError::Capacity), "{bad:?}");
            assert_eq!(parse("1", bad, "1"), Err(TbError::Rate), "{bad:?}");
            assert_eq!(parse("1", "1", bad), Err(TbError::Count), "{bad:?}");
        }
    }

    #[test]
    fn limit_and_lease_ms_are_whole_numbers_from_1_to_2_pow_53() {
        assert_eq!(parse_limit(b"5"), Ok(5));
        assert_eq!(parse_limit(b"007"), Ok(7));
        assert_eq!(parse_lease_ms(b"9007199254740992"), Ok(1 << 53));
        let long = format!("{}1", "0".repeat(64));
        for bad in [
            "0",
            "",
            "-1",
            "+1",
            "1.0",
            "1e3",
            " 1",
            "1 ",
            "9007199254740993",
            "0x10",
            &long,
        ] {
            assert_eq!(parse_limit(bad.as_bytes()), Err(TbError::Limit), "{bad:?}");
            assert_eq!(
                parse_lease_ms(bad.as_bytes()),
                Err(TbError::LeaseMs),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_limit(&"9".repeat(64).into_bytes()),
            Err(TbError::Limit)
        );
    }

    proptest! {
        #[test]
        fn whole_numbers_read_back_as_their_decimal_text(value in 1i64..=(1i64 << 53)) {
            prop_assert_eq!(parse_limit(value.to_string().as_bytes()), Ok(value));
        }

        #[test]
        fn accepted_requests_are_always_usable(
            c in proptest::collection::vec(any::<u8>(), 0..70),
            r in "[-+0-9.eE]{0,12}",
            n in "\\PC{0,12}",
        ) {
            if let Ok(req) = parse_request(&c, r.as_bytes(), Some(n.as_bytes())) {
                prop_assert!(req.limit.capacity.is_finite() && req.limit.capacity > 0.0);
                prop_assert!(req.limit.refill_per_sec.is_finite() && req.limit.refill_per_sec > 0.0);
                prop_assert!(req.n.is_finite() && req.n >= 0.0);
                prop_assert!(req.limit.capacity <= MAX_EXACT_INTEGER as f64 && req.n <= MAX_EXACT_INTEGER as f64);
            }
        }
    }
}

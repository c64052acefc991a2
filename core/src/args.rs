//! Command arguments -> a typed, validated request.

use crate::bucket::{Limit, TakeOptions};
use crate::error::{OptionName, TbError};
use crate::lockout::Block;
use crate::number::{at_most_max_exact_integer, parse_decimal, Sign, MAX_EXACT_INTEGER};

/// `capacity rate [n]` of TB.TAKE / TB.PEEK, validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    pub limit: Limit,
    /// Tokens to take; finite and >= 0.
    pub n: f64,
}

/// Parses the numbers after the key. `n` is `None` where it may be left out
/// (TB.PEEK), and then means 1. Arguments are checked in order, so the error
/// names the first bad one. The bound 2^53 of capacity and n is judged on
/// the exact text (`at_most_max_exact_integer`).
pub fn parse_request(capacity: &[u8], rate: &[u8], n: Option<&[u8]>) -> Result<Request, TbError> {
    let capacity_value = positive(capacity).ok_or(TbError::Capacity)?;
    if !at_most_max_exact_integer(capacity, capacity_value) {
        return Err(TbError::CapacityTooLarge);
    }
    let refill_per_sec = positive(rate).ok_or(TbError::Rate)?;
    let n = match n {
        Some(text) => {
            let n = parse_decimal(text, Sign::Forbidden).ok_or(TbError::Count)?;
            if !at_most_max_exact_integer(text, n) {
                return Err(TbError::CountTooLarge);
            }
            n
        }
        None => 1.0,
    };
    Ok(Request {
        limit: Limit {
            capacity: capacity_value,
            refill_per_sec,
        },
        n,
    })
}

/// The `timeout_ms` of TB.BTAKE and TB.ACQUIRE: how long to wait at most,
/// in whole ms (a fraction rounds up), 0 for no limit, at most 2^53 by the
/// exact text.
pub fn parse_timeout(text: &[u8]) -> Result<i64, TbError> {
    let timeout_ms = parse_decimal(text, Sign::Forbidden)
        .filter(|ms| at_most_max_exact_integer(text, *ms))
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

/// The options after TB.TAKE's (or TB.TAKEALL's last group's) arguments:
/// `MAXWAIT ms`, `BLOCK ms` and `MAXBLOCK ms`, keywords in any case and
/// order, each at most once. `MAXWAIT` is whole ms in [0, 2^53]; `BLOCK`
/// and `MAXBLOCK` in [1, 2^53], `MAXBLOCK` at least `BLOCK` and only with
/// it. No options is `TakeOptions::PLAIN`.
pub fn parse_take_options(options: &[&[u8]]) -> Result<TakeOptions, TbError> {
    let mut max_wait_ms = None;
    let mut block_ms = None;
    let mut max_block_ms = None;
    let mut rest = options.iter();
    while let Some(keyword) = rest.next() {
        let (slot, name, error, least) = if keyword.eq_ignore_ascii_case(b"MAXWAIT") {
            (&mut max_wait_ms, OptionName::MaxWait, TbError::MaxWait, 0)
        } else if keyword.eq_ignore_ascii_case(b"BLOCK") {
            (&mut block_ms, OptionName::Block, TbError::Block, 1)
        } else if keyword.eq_ignore_ascii_case(b"MAXBLOCK") {
            (
                &mut max_block_ms,
                OptionName::MaxBlock,
                TbError::MaxBlock,
                1,
            )
        } else {
            return Err(TbError::UnknownOption);
        };
        if slot.is_some() {
            return Err(TbError::RepeatedOption(name));
        }
        let value = rest.next().ok_or(TbError::MissingOptionValue(name))?;
        *slot = Some(whole_from(value, least).ok_or(error)?);
    }
    let block = match (block_ms, max_block_ms) {
        (None, None) => None,
        (None, Some(_)) => return Err(TbError::MaxBlockWithoutBlock),
        (Some(block_ms), None) => Some(Block {
            block_ms,
            max_block_ms: block_ms,
        }),
        (Some(block_ms), Some(max_block_ms)) if max_block_ms >= block_ms => Some(Block {
            block_ms,
            max_block_ms,
        }),
        (Some(_), Some(_)) => return Err(TbError::MaxBlock),
    };
    Ok(TakeOptions {
        max_wait_ms: max_wait_ms.unwrap_or(0),
        block,
    })
}

/// TB.CHARGE's options: `MAXDEBT d`, a number in [0, 2^53] (by the exact
/// text), once. `None` when not given (the debt limit is then the capacity).
pub fn parse_charge_options(options: &[&[u8]]) -> Result<Option<f64>, TbError> {
    match options {
        [] => Ok(None),
        [keyword, ..] if !keyword.eq_ignore_ascii_case(b"MAXDEBT") => Err(TbError::UnknownOption),
        [_] => Err(TbError::MissingOptionValue(OptionName::MaxDebt)),
        [_, value] => parse_decimal(value, Sign::Forbidden)
            .filter(|debt| at_most_max_exact_integer(value, *debt))
            .map(Some)
            .ok_or(TbError::MaxDebt),
        [_, _, next, ..] if next.eq_ignore_ascii_case(b"MAXDEBT") => {
            Err(TbError::RepeatedOption(OptionName::MaxDebt))
        }
        [_, _, ..] => Err(TbError::UnknownOption),
    }
}

/// Where TB.TAKEALL's options begin: after the last whole group of four
/// (`key capacity rate n`) that does not start with an option keyword. A
/// key named like an option can therefore only be TB.TAKEALL's first.
pub fn take_all_options_start(groups: &[&[u8]]) -> usize {
    let is_keyword = |arg: &[u8]| {
        [&b"MAXWAIT"[..], b"BLOCK", b"MAXBLOCK"]
            .iter()
            .any(|keyword| arg.eq_ignore_ascii_case(keyword))
    };
    let mut start = 0;
    while let Some(first) = groups.get(start) {
        if start > 0 && is_keyword(first) {
            break;
        }
        start = start.saturating_add(4);
    }
    start.min(groups.len())
}

/// Plain decimal digits valued from `least` (0 or 1) to 2^53 (see `whole`).
pub(crate) fn whole_from(text: &[u8], least: i64) -> Option<i64> {
    if least == 0 && !text.is_empty() && text.iter().all(|digit| *digit == b'0') && text.len() <= 64
    {
        return Some(0);
    }
    whole(text)
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

    /// 2^53 + 1 and 2^53 + 0.5 round to the double 2^53; the bound is on
    /// their text.
    #[test]
    fn numbers_just_above_2_pow_53_are_refused_though_they_round_to_it() {
        for above in [
            "9007199254740993",
            "9007199254740992.5",
            "9.007199254740993e15",
        ] {
            assert_eq!(
                parse(above, "1", "1"),
                Err(TbError::CapacityTooLarge),
                "{above}"
            );
            assert_eq!(
                parse("1", "1", above),
                Err(TbError::CountTooLarge),
                "{above}"
            );
            assert_eq!(
                parse_timeout(above.as_bytes()),
                Err(TbError::Timeout),
                "{above}"
            );
            let options = [&b"MAXDEBT"[..], above.as_bytes()];
            assert_eq!(
                parse_charge_options(&options),
                Err(TbError::MaxDebt),
                "{above}"
            );
        }
        let bound = "90071992547409920e-1"; // 2^53 itself, written otherwise
        assert!(parse(bound, "1", bound).is_ok());
        assert_eq!(parse_timeout(bound.as_bytes()), Ok(1 << 53));
        let options = [&b"MAXDEBT"[..], bound.as_bytes()];
        assert_eq!(parse_charge_options(&options), Ok(Some(9007199254740992.0)));
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

    fn take_options(words: &str) -> Result<TakeOptions, TbError> {
        let words: Vec<&[u8]> = words.split_whitespace().map(str::as_bytes).collect();
        parse_take_options(&words)
    }

    #[test]
    fn take_options_come_in_any_order_and_case() {
        assert_eq!(take_options(""), Ok(TakeOptions::PLAIN));
        let got = take_options("block 100 MaxWait 0 MAXBLOCK 800").unwrap();
        assert_eq!(got.max_wait_ms, 0);
        assert_eq!(
            got.block,
            Some(Block {
                block_ms: 100,
                max_block_ms: 800
            })
        );
        let got = take_options("BLOCK 5").unwrap();
        assert_eq!(
            got.block.map(|b| b.max_block_ms),
            Some(5),
            "no MAXBLOCK: no growth"
        );
        assert_eq!(
            take_options("MAXWAIT 9007199254740992")
                .unwrap()
                .max_wait_ms,
            1 << 53
        );
    }

    #[test]
    fn bad_take_options_are_named() {
        for (words, error) in [
            ("WAIT 5", TbError::UnknownOption),
            (
                "MAXWAIT 5 MAXWAIT 5",
                TbError::RepeatedOption(OptionName::MaxWait),
            ),
            (
                "BLOCK 10 block 10",
                TbError::RepeatedOption(OptionName::Block),
            ),
            ("MAXWAIT", TbError::MissingOptionValue(OptionName::MaxWait)),
            (
                "BLOCK 100 MAXBLOCK",
                TbError::MissingOptionValue(OptionName::MaxBlock),
            ),
            ("MAXWAIT -1", TbError::MaxWait),
            ("MAXWAIT 1.5", TbError::MaxWait),
            ("MAXWAIT 9007199254740993", TbError::MaxWait),
            ("BLOCK 0", TbError::Block),
            ("BLOCK 10 MAXBLOCK 9", TbError::MaxBlock),
            ("MAXBLOCK 10", TbError::MaxBlockWithoutBlock),
        ] {
            assert_eq!(take_options(words), Err(error), "{words:?}");
        }
    }

    #[test]
    fn maxdebt_is_a_number_from_zero_to_2_pow_53_given_once() {
        let charge = |words: &str| {
            let words: Vec<&[u8]> = words.split_whitespace().map(str::as_bytes).collect();
            parse_charge_options(&words)
        };
        assert_eq!(charge(""), Ok(None));
        assert_eq!(charge("maxdebt 2.5"), Ok(Some(2.5)));
        assert_eq!(charge("MAXDEBT 0"), Ok(Some(0.0)));
        assert_eq!(
            charge("MAXDEBT"),
            Err(TbError::MissingOptionValue(OptionName::MaxDebt))
        );
        assert_eq!(charge("MAXDEBT -1"), Err(TbError::MaxDebt));
        assert_eq!(charge("MAXDEBT 1e16"), Err(TbError::MaxDebt));
        assert_eq!(
            charge("MAXDEBT 1 maxdebt 2"),
            Err(TbError::RepeatedOption(OptionName::MaxDebt))
        );
        assert_eq!(charge("MAXWAIT 1"), Err(TbError::UnknownOption));
        assert_eq!(charge("MAXDEBT 1 x"), Err(TbError::UnknownOption));
    }

    #[test]
    fn take_all_options_start_after_the_last_group() {
        let split = |words: &str| {
            let words: Vec<&[u8]> = words.split_whitespace().map(str::as_bytes).collect();
            take_all_options_start(&words)
        };
        assert_eq!(split("a 1 1 1"), 4);
        assert_eq!(split("a 1 1 1 b 1 1 1"), 8);
        assert_eq!(split("a 1 1 1 MAXWAIT 5"), 4);
        assert_eq!(split("a 1 1 1 b 1 1 1 block 5 maxblock 9"), 8);
        assert_eq!(
            split("block 1 1 1 MAXWAIT 5"),
            4,
            "only the first key may look like one"
        );
        assert_eq!(split("a 1 1"), 3);
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

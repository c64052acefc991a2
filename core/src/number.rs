//! Decimal text <-> f64, for arguments and for the stored `tokens` field.
//!
//! Rust's `f64::from_str` alone is too permissive for a wire protocol
//! (`inf`, `NaN`, `+5`, `1_0` is refused but `infinity` is not), so the text
//! is first checked against a small decimal grammar. The same pass gathers
//! the digits, so everyday numbers convert exactly in one step; the rest go
//! to the standard library. Either way the result is correctly rounded and
//! nothing is allocated.
//!
//! Formatting writes the shortest text that reads back as the same f64,
//! the text Rust's `{}` gives (the Lua fallback mirrors it byte for byte).

/// Longer inputs are refused outright: no real limit needs 64 characters,
/// and a bound keeps hostile stored values from costing anything.
pub const MAX_LEN: usize = 64;

/// Whether a leading `+` or `-` is accepted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sign {
    /// Arguments: a sign is never needed (all must be >= 0), so none is
    /// accepted; `-1` is then refused with the argument's own message.
    Forbidden,
    /// Stored fields: other writers (a Lua script, a person with HSET) may
    /// have written `-0` or `-3`; those are numbers, to be judged by value.
    Allowed,
}

/// Parses `[sign] (digits [. digits*] | . digits) [(e|E) [sign] digits]`
/// into a finite f64. Anything else, including overflow to infinity, is
/// `None`.
pub fn parse_decimal(text: &[u8], sign: Sign) -> Option<f64> {
    if text.is_empty() || text.len() > MAX_LEN {
        return None;
    }
    let shape = scan_decimal(text, sign)?;
    if let Some(value) = shape.exact_value() {
        return Some(value);
    }
    // SAFETY: `scan_decimal` accepted only ASCII digits, signs, '.', 'e' and
    // 'E', so the bytes are valid UTF-8; checking again costs ~100
    // instructions per number on the hot path.
    let text = unsafe { std::str::from_utf8_unchecked(text) };
    let value: f64 = text.parse().ok()?;
    value.is_finite().then_some(value)
}

/// What one pass over a valid decimal learned, enough to convert the
/// everyday cases (`20`, `0.5`, `1700000000000`, `98.01246`) without the
/// general algorithm.
struct DecimalShape {
    negative: bool,
    /// All digits, without the point, as an integer; `None` once it
    /// overflows u64 (then only the general algorithm will do).
    digits: Option<u64>,
    /// Digits after the point.
    frac_digits: usize,
    has_exponent: bool,
}

/// 10^0 ..= 10^22: every one is exactly representable as an f64.
const EXACT_POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// 2^53, the one bound of every number the module takes, stores or reports:
/// capacity and n, whole ms (timeouts, `lease_ms`, waits, deadlines) and
/// counts. Every integer up to it is exact in an f64, so in a sorted-set
/// score and a JavaScript number too: taking one whole token always changes
/// the count (past it `tokens - 1 == tokens`, and a take would be granted
/// while changing nothing), and a wait of 2^53 ms (about 285,000 years) is
/// still counted in single milliseconds.
pub const MAX_EXACT_INTEGER: i64 = 1 << 53;

/// 2^53's digits, for comparing a decimal text with it digit by digit.
const MAX_EXACT_INTEGER_DIGITS: &[u8; 16] = b"9007199254740992";

/// Whether the exact value of `text`, a decimal `parse_decimal` accepts, is
/// above 2^53. It is judged on the digits, not on the f64: a text just
/// above 2^53 (`9007199254740993`, `9007199254740992.5`) rounds to the
/// double 2^53 and would pass a check made after the conversion. A bound is
/// therefore checked as `value < 2^53` or, when the double is exactly 2^53,
/// with this (`at_most_max_exact_integer`), so the usual number costs one
/// comparison more.
pub fn above_max_exact_integer(text: &[u8]) -> bool {
    let (negative, unsigned) = match text {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, text),
    };
    let (mantissa, exponent) = match unsigned.iter().position(|b| matches!(b, b'e' | b'E')) {
        Some(at) => (
            unsigned.get(..at).unwrap_or_default(),
            unsigned.get(at.saturating_add(1)..).unwrap_or_default(),
        ),
        None => (unsigned, &b""[..]),
    };
    let (int, frac) = match mantissa.iter().position(|b| *b == b'.') {
        Some(at) => (
            mantissa.get(..at).unwrap_or_default(),
            mantissa.get(at.saturating_add(1)..).unwrap_or_default(),
        ),
        None => (mantissa, &b""[..]),
    };
    let digits = || int.iter().chain(frac).copied();
    let Some(first) = digits().position(|digit| digit != b'0') else {
        return false; // zero
    };
    if negative {
        return false;
    }
    // The value is 0.d1d2d3... x 10^magnitude, d1 its first digit that is
    // not 0; 2^53 is 0.9007199254740992 x 10^16. Lengths are at most
    // MAX_LEN and the exponent saturates, so nothing overflows.
    let magnitude = (int.len() as i64)
        .saturating_sub(first as i64)
        .saturating_add(exponent_value(exponent));
    if magnitude != 16 {
        return magnitude > 16;
    }
    for (at, digit) in digits().skip(first).enumerate() {
        let bound = MAX_EXACT_INTEGER_DIGITS.get(at).copied().unwrap_or(b'0');
        if digit != bound {
            return digit > bound;
        }
    }
    false
}

/// `value`, read from `text`, is at most 2^53 by the exact value of `text`
/// (see `above_max_exact_integer`).
pub fn at_most_max_exact_integer(text: &[u8], value: f64) -> bool {
    let bound = MAX_EXACT_INTEGER as f64;
    value < bound || (value == bound && !above_max_exact_integer(text))
}

/// An exponent's text (`[+-]digits`), saturating far beyond any magnitude
/// an f64 can hold.
fn exponent_value(text: &[u8]) -> i64 {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, text),
    };
    let magnitude = digits.iter().fold(0i64, |value, digit| {
        value
            .saturating_mul(10)
            .saturating_add(i64::from(digit.wrapping_sub(b'0')))
    });
    if negative {
        magnitude.saturating_neg()
    } else {
        magnitude
    }
}

impl DecimalShape {
    /// The value when it can be had exactly with one operation: an integer
    /// of at most 2^53 over a power of ten up to 10^22 are both exact f64s,
    /// and IEEE division rounds their quotient correctly, so the result is
    /// the correctly rounded value of the text, the same f64 the general
    /// algorithm gives (Clinger's fast path).
    fn exact_value(&self) -> Option<f64> {
        if self.has_exponent {
            return None;
        }
        let digits = self
            .digits
            .filter(|d| *d <= MAX_EXACT_INTEGER.unsigned_abs())?;
        let scale = EXACT_POWERS_OF_TEN.get(self.frac_digits)?;
        // `digits` <= 2^53 converts exactly.
        let magnitude = digits as f64 / scale;
        Some(if self.negative { -magnitude } else { magnitude })
    }
}

/// Checks the grammar of `parse_decimal`, gathering the digits as it goes.
fn scan_decimal(text: &[u8], sign: Sign) -> Option<DecimalShape> {
    let mut rest = text;
    let mut negative = false;
    if sign == Sign::Allowed {
        if let [first @ (b'+' | b'-'), tail @ ..] = rest {
            negative = *first == b'-';
            rest = tail;
        }
    }
    let mut digits = Some(0u64);
    let int_digits = take_digits(&mut rest, &mut digits);
    let mut frac_digits = 0;
    if let [b'.', tail @ ..] = rest {
        rest = tail;
        frac_digits = take_digits(&mut rest, &mut digits);
    }
    if int_digits == 0 && frac_digits == 0 {
        return None;
    }
    // 19 digits always fit in a u64; with more, the sum may have wrapped.
    if int_digits.saturating_add(frac_digits) > 19 {
        digits = None;
    }
    let mut has_exponent = false;
    if let [b'e' | b'E', tail @ ..] = rest {
        has_exponent = true;
        rest = tail;
        if let [b'+' | b'-', tail @ ..] = rest {
            rest = tail;
        }
        if take_digits(&mut rest, &mut None) == 0 {
            return None;
        }
    }
    rest.is_empty().then_some(DecimalShape {
        negative,
        digits,
        frac_digits,
        has_exponent,
    })
}

/// Advances `rest` past its leading ASCII digits, appending them to
/// `value` (if it is `Some`), and returns how many there were. The caller
/// drops the value when there were more than 19 digits in all.
fn take_digits(rest: &mut &[u8], value: &mut Option<u64>) -> usize {
    let mut count = 0usize;
    let mut acc = value.unwrap_or(0);
    while let [digit @ b'0'..=b'9', tail @ ..] = *rest {
        // Wrapping is harmless: a value that could have wrapped is
        // discarded by the caller's digit count.
        acc = acc
            .wrapping_mul(10)
            .wrapping_add(u64::from(digit.wrapping_sub(b'0')));
        count = count.wrapping_add(1);
        *rest = tail;
    }
    if let Some(seen) = value.as_mut() {
        *seen = acc;
    }
    count
}

/// A fixed-size text buffer, so formatting a value costs no heap allocation.
pub struct NumberText {
    bytes: [u8; 40],
    len: usize,
}

impl NumberText {
    fn new() -> Self {
        NumberText {
            bytes: [0; 40],
            len: 0,
        }
    }

    /// Appends `text`; a write past the end (which no caller makes) is
    /// dropped.
    pub fn push(&mut self, text: &[u8]) {
        let Some(end) = self.len.checked_add(text.len()) else {
            return;
        };
        if let Some(dest) = self.bytes.get_mut(self.len..end) {
            dest.copy_from_slice(text);
            self.len = end;
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

impl std::fmt::Write for NumberText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let before = self.len;
        self.push(s.as_bytes());
        if self.len == before && !s.is_empty() {
            return Err(std::fmt::Error);
        }
        Ok(())
    }
}

/// Formats a token count as the shortest decimal that parses back to the
/// same f64 (Rust's float formatting guarantees the round trip), in plain
/// notation for everyday magnitudes and in exponent notation otherwise, so
/// it never exceeds 24 characters. Both forms are read by `parse_decimal`
/// and by Lua's `tonumber`.
pub fn format_tokens(tokens: f64) -> NumberText {
    use std::fmt::Write;
    let magnitude = tokens.abs();
    let plain = magnitude == 0.0 || (1e-4..1e15).contains(&magnitude);
    if plain {
        // A whole, non-negative count (a new or refunded-to-full bucket, any
        // integer rate) is its digits: the same text as below, without the
        // general float formatter.
        if tokens.is_sign_positive() && tokens.fract() == 0.0 {
            // Exact: a whole number below 1e15 < 2^53.
            return format_integer(tokens as i64);
        }
        // The usual fractional count, e.g. 98.01246: Ryu finds the same
        // shortest digits four times faster. The two differ only when the
        // value sits exactly halfway between two shortest candidates (Ryu
        // rounds such a tie to even, Rust up), which needs a short binary
        // fraction; `no_decimal_tie` rules that out first.
        if no_decimal_tie(tokens) {
            let mut buffer = ryu::Buffer::new();
            let mut out = NumberText::new();
            // In this range Ryu writes plain notation, as `{}` does.
            out.push(buffer.format_finite(tokens).as_bytes());
            return out;
        }
    }
    let mut out = NumberText::new();
    // Both forms of a finite f64 fit in 40 bytes (the longest is
    // "-2.2250738585072014e-308", 24 bytes), so write! cannot fail; if it
    // somehow did, the buffer would hold a prefix that fails to parse and
    // the caller would refuse it, so the result is checked there.
    let _ = if plain {
        write!(out, "{tokens}")
    } else {
        write!(out, "{tokens:e}")
    };
    out
}

/// Whether `value` (non-integral, 1e-4 <= |value| < 1e15) has an exact
/// decimal expansion too long for it to lie exactly halfway between two
/// shortest round-trip candidates.
///
/// A tie between candidates of at most 17 significant digits needs an exact
/// expansion of at most 18. Writing `value` as `odd * 2^-k` (k >= 1, as it
/// is not whole), its expansion has exactly k digits after the point, the
/// last a 5. Above 1 that is the integer digits plus k significant digits;
/// below 1 (down to 1e-4) at most 3 of the k are leading zeros. Whenever
/// that comes to 19 or more, no tie is possible.
fn no_decimal_tie(value: f64) -> bool {
    const MANTISSA_BITS: u32 = 52;
    let bits = value.to_bits();
    let biased_exponent = (bits >> MANTISSA_BITS) & 0x7ff;
    let fraction = bits & ((1u64 << MANTISSA_BITS) - 1);
    // Subnormals (far below 1e-4) and zero are not asked about; refusing
    // them keeps the arithmetic below simple.
    if biased_exponent == 0 {
        return false;
    }
    // value = (2^52 + fraction) * 2^(biased_exponent - 1075); k is minus the
    // exponent of its lowest set bit. Every term is at most a few thousand.
    let mantissa = fraction | (1u64 << MANTISSA_BITS);
    let lowest_bit = (biased_exponent as i64)
        .saturating_sub(1075)
        .saturating_add(i64::from(mantissa.trailing_zeros()));
    let fraction_digits = lowest_bit.saturating_neg();
    let magnitude = value.abs();
    let significant = if magnitude >= 1.0 {
        // Below 1e15, the integer part converts exactly.
        let integer_digits = (magnitude as u64)
            .checked_ilog10()
            .map_or(0, |log| log.saturating_add(1));
        fraction_digits.saturating_add(i64::from(integer_digits))
    } else {
        fraction_digits.saturating_sub(3)
    };
    significant >= 19
}

/// Two ASCII digits for each of 00..=99.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Formats an integer in decimal (what `{}` prints), without `core::fmt`.
pub fn format_integer(value: i64) -> NumberText {
    let mut out = NumberText::new();
    // Digits are produced last first, two at a time, into the end of a
    // scratch buffer (20 digits hold any u64).
    let mut scratch = [0u8; 20];
    let mut start = scratch.len();
    let mut rest = value.unsigned_abs();
    loop {
        let (pair, digits) = if rest >= 10 {
            ((rest % 100) as usize, 2)
        } else {
            (rest as usize, 1)
        };
        rest = if digits == 2 { rest / 100 } else { 0 };
        // `pair` < 100, so both indexes are within DIGIT_PAIRS.
        let pair_text = DIGIT_PAIRS
            .get(pair.wrapping_mul(2)..pair.wrapping_mul(2).wrapping_add(2))
            .unwrap_or_default();
        let Some(from) = start.checked_sub(digits) else {
            break;
        };
        if let (Some(dest), Some(src)) = (
            scratch.get_mut(from..start),
            pair_text.get(2usize.wrapping_sub(digits)..),
        ) {
            dest.copy_from_slice(src);
        }
        start = from;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b"-");
    }
    out.push(scratch.get(start..).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arg(text: &str) -> Option<f64> {
        parse_decimal(text.as_bytes(), Sign::Forbidden)
    }

    #[test]
    fn it_accepts_plain_decimals() {
        for (text, value) in [
            ("20", 20.0),
            ("2.5", 2.5),
            ("1e3", 1000.0),
            ("1E-3", 0.001),
            ("1e+2", 100.0),
            (".5", 0.5),
            ("5.", 5.0),
            ("0", 0.0),
            ("007", 7.0),
            ("1e-400", 0.0),
        ] {
            assert_eq!(arg(text), Some(value), "{text:?}");
        }
    }

    #[test]
    fn it_rejects_everything_else() {
        let too_long = "1".repeat(MAX_LEN + 1);
        for text in [
            "", " 5", "5 ", "-1", "+1", "nan", "NaN", "inf", "-inf", "infinity", "0x10", "1e400",
            "1_000", "1,5", ".", "e5", "1e", "1e+", "1.2.3", "--1", "5\0", "١", &too_long,
        ] {
            assert_eq!(arg(text), None, "{text:?}");
        }
    }

    #[test]
    fn stored_values_may_carry_a_sign() {
        let stored = |t: &str| parse_decimal(t.as_bytes(), Sign::Allowed);
        assert_eq!(stored("-3"), Some(-3.0));
        assert_eq!(stored("+1e+15"), Some(1e15));
        assert_eq!(stored("0.10000000000000001"), Some(0.1));
        assert_eq!(stored("-nan"), None);
        assert_eq!(stored("-"), None);
    }

    #[test]
    fn tokens_are_written_readably() {
        let text = |v: f64| String::from_utf8(format_tokens(v).as_bytes().to_vec()).unwrap();
        assert_eq!(text(9.0), "9");
        assert_eq!(text(0.0), "0");
        assert_eq!(text(2.75), "2.75");
        assert_eq!(text(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(text(1e300), "1e300");
        assert_eq!(text(1.5e-7), "1.5e-7");
        assert_eq!(text(-0.0), "-0");
        assert_eq!(text(999999999999999.0), "999999999999999");
        assert_eq!(text(1e15), "1e15");
        assert_eq!(text(-3.0), "-3");
    }

    #[test]
    fn only_short_binary_fractions_can_be_decimal_ties() {
        // Short exact expansions (at most 18 digits): Rust's formatting.
        for value in [
            0.5,
            2.5,
            1.0 / 64.0,
            999_999_999.5,
            3.0 * 2f64.powi(-15),
            999_999_999_999_999.9, // 15 integer digits + 3 binary fraction digits
            -0.5,
        ] {
            assert!(!no_decimal_tie(value), "{value}");
        }
        // Long ones: Ryu.
        for value in [
            0.1,
            98.01246,
            2f64.powi(-22),
            1e-4,
            123_456_789.123,
            999_999_999.001,
            -98.01246,
        ] {
            assert!(no_decimal_tie(value), "{value}");
        }
        assert!(!no_decimal_tie(0.0));
        assert!(!no_decimal_tie(5e-324));
    }

    /// Every f64 whose binary expansion ends at 2^-26 or below, sampled
    /// across the plain range and its edges, formats as `{}` does.
    #[test]
    fn the_ryu_path_agrees_with_the_standard_library() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut checked = 0;
        while checked < 2_000_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let exponent = 1023 - 14 + (state >> 58) as i64 % 64; // ~2^-14 .. 2^49
            let value = f64::from_bits((state & ((1 << 52) - 1)) | ((exponent as u64) << 52));
            if !(1e-4..1e15).contains(&value) || value.fract() == 0.0 {
                continue;
            }
            for value in [value, -value] {
                let text = format_tokens(value);
                assert_eq!(text.as_bytes(), format!("{value}").as_bytes(), "{value:e}");
            }
            checked += 1;
        }
    }

    #[test]
    fn integers_are_written_in_decimal() {
        for value in [
            0,
            7,
            -7,
            9,
            10,
            11,
            99,
            100,
            101,
            1005,
            -1005,
            1_700_000_000_000,
            i64::MAX,
            i64::MIN,
        ] {
            assert_eq!(
                format_integer(value).as_bytes(),
                value.to_string().as_bytes()
            );
        }
    }

    #[test]
    fn the_exact_shortcut_matches_the_general_algorithm_at_its_edges() {
        for text in [
            "9007199254740992", // 2^53: the last integer taken exactly
            "9007199254740993", // 2^53 + 1: rounds, so left to the general path
            "18446744073709551615",
            "18446744073709551616",
            "0.0000000000000000000001",  // 22 fraction digits
            "0.00000000000000000000001", // 23
            "123456789.123456789",
            "-0",
            "-0.0",
            "1700000000000",
            "98.01246",
        ] {
            let expected: f64 = text.parse().unwrap();
            let got = parse_decimal(text.as_bytes(), Sign::Allowed).unwrap();
            assert_eq!(got.to_bits(), expected.to_bits(), "{text}");
        }
    }

    #[test]
    fn the_bound_2_pow_53_is_judged_on_the_exact_text() {
        for text in [
            "9007199254740992",
            "9007199254740992.0000",
            "00009007199254740992",
            "9007199254740991.5",
            "9.007199254740992e15",
            "90071992547409920e-1",
            "0.9007199254740992E+16",
            "9007199254740991.99999999999999999999",
            "1e-400",
            "0",
            "-9007199254740993",
            "1",
        ] {
            assert!(!above_max_exact_integer(text.as_bytes()), "{text}");
        }
        for text in [
            "9007199254740993",
            "9007199254740992.5",
            "9007199254740992.0000000000000000001",
            "9.007199254740993e15",
            "9.0071992547409921e15",
            "90071992547409921e-1",
            "1e16",
            "10000000000000000",
            "1e300",
            "1e99999999999999999999999999999999999",
        ] {
            assert!(above_max_exact_integer(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn texts_that_round_to_2_pow_53_are_above_it_when_their_digits_are() {
        let bound = MAX_EXACT_INTEGER as f64;
        assert!(at_most_max_exact_integer(b"9007199254740992", bound));
        assert!(!at_most_max_exact_integer(b"9007199254740993", bound));
        assert!(!at_most_max_exact_integer(b"9007199254740992.5", bound));
        assert!(!at_most_max_exact_integer(b"9007199254740994", bound + 2.0));
        assert!(at_most_max_exact_integer(b"5", 5.0));
    }

    proptest! {
        /// Against exact integer arithmetic: `digits` x 10^`exponent`
        /// compared with 2^53 in i128 (or by its length).
        #[test]
        fn the_bound_agrees_with_exact_arithmetic(
            digits in "[0-9]{1,24}", point in 0usize..25, exponent in -30i32..30,
        ) {
            let point = point.min(digits.len());
            let text = format!("{}.{}e{exponent}", &digits[..point], &digits[point..]);
            // value = digits x 10^(exponent - fraction digits)
            let scale = exponent - (digits.len() - point) as i32;
            let whole: u128 = digits.parse().unwrap();
            let max = 1u128 << 53;
            let expected = if whole == 0 {
                false
            } else if scale >= 0 {
                scale > 38 || whole.saturating_mul(10u128.pow(scale as u32)) > max
            } else {
                let down = (-scale) as u32;
                // whole / 10^down > max  <=>  whole > max * 10^down
                down <= 38 && whole > max.saturating_mul(10u128.pow(down))
            };
            prop_assert_eq!(above_max_exact_integer(text.as_bytes()), expected, "{}", text);
        }

        #[test]
        fn formatted_tokens_parse_back_to_the_same_value(value in any::<f64>()) {
            prop_assume!(value.is_finite());
            let text = format_tokens(value);
            prop_assert!(text.as_bytes().len() <= 24);
            prop_assert_eq!(parse_decimal(text.as_bytes(), Sign::Allowed), Some(value));
        }

        #[test]
        fn parsing_never_panics_and_only_yields_finite_values(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            for sign in [Sign::Forbidden, Sign::Allowed] {
                if let Some(v) = parse_decimal(&bytes, sign) {
                    prop_assert!(v.is_finite());
                }
            }
        }

        #[test]
        fn plain_decimals_parse_exactly_as_the_standard_library_does(
            sign in "[-+]?", int in "[0-9]{0,20}", frac in proptest::option::of("[0-9]{0,25}"),
        ) {
            let text = match &frac {
                Some(frac) => format!("{sign}{int}.{frac}"),
                None => format!("{sign}{int}"),
            };
            let expected = text.parse::<f64>().ok().filter(|v| v.is_finite());
            let got = parse_decimal(text.as_bytes(), Sign::Allowed);
            prop_assert_eq!(got.map(f64::to_bits), expected.map(f64::to_bits), "{}", text);
        }

        #[test]
        fn integers_are_formatted_as_the_standard_library_does(value in any::<i64>()) {
            let text = format_integer(value);
            let expected = value.to_string();
            prop_assert_eq!(text.as_bytes(), expected.as_bytes());
        }

        #[test]
        fn fractional_counts_are_formatted_as_the_standard_library_does(
            bits in any::<u64>(), scale in -4i32..15,
        ) {
            // A random mantissa at a random magnitude within the plain range.
            let value = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52)) * 10f64.powi(scale);
            prop_assume!((1e-4..1e15).contains(&value));
            let text = format_tokens(value);
            let expected = format!("{value}");
            prop_assert_eq!(text.as_bytes(), expected.as_bytes());
        }

        #[test]
        fn whole_token_counts_are_formatted_as_any_other(value in 0u64..2_000_000_000_000_000) {
            let tokens = value as f64;
            let expected = if tokens < 1e15 { format!("{tokens}") } else { format!("{tokens:e}") };
            let text = format_tokens(tokens);
            prop_assert_eq!(text.as_bytes(), expected.as_bytes());
        }

        #[test]
        fn parsing_agrees_with_the_standard_library_on_valid_text(
            int in "[0-9]{1,10}", frac in "[0-9]{0,10}", exp in -30i32..30,
        ) {
            let text = format!("{int}.{frac}e{exp}");
            prop_assert_eq!(arg(&text), text.parse::<f64>().ok());
        }
    }
}

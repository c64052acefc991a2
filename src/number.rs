//! Decimal text <-> f64, for arguments and for the stored `tokens` field.
//!
//! Rust's `f64::from_str` alone is too permissive for a wire protocol
//! (`inf`, `NaN`, `+5`, `1_0` is refused but `infinity` is not), so the text
//! is first checked against a small decimal grammar, then converted by the
//! standard library (correctly rounded, allocation-free).

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
    if text.is_empty() || text.len() > MAX_LEN || !is_decimal(text, sign) {
        return None;
    }
    // SAFETY: `is_decimal` accepted only ASCII digits, signs, '.', 'e' and
    // 'E', so the bytes are valid UTF-8; checking again costs ~100
    // instructions per number on the hot path.
    let text = unsafe { std::str::from_utf8_unchecked(text) };
    let value: f64 = text.parse().ok()?;
    value.is_finite().then_some(value)
}

fn is_decimal(text: &[u8], sign: Sign) -> bool {
    let mut rest = text;
    if sign == Sign::Allowed {
        if let [b'+' | b'-', tail @ ..] = rest {
            rest = tail;
        }
    }
    let int_digits = count_digits(rest);
    rest = rest.get(int_digits..).unwrap_or_default();
    let mut frac_digits = 0;
    if let [b'.', tail @ ..] = rest {
        frac_digits = count_digits(tail);
        rest = tail.get(frac_digits..).unwrap_or_default();
    }
    if int_digits == 0 && frac_digits == 0 {
        return false;
    }
    if let [b'e' | b'E', tail @ ..] = rest {
        rest = tail;
        if let [b'+' | b'-', tail @ ..] = rest {
            rest = tail;
        }
        let exp_digits = count_digits(rest);
        if exp_digits == 0 {
            return false;
        }
        rest = rest.get(exp_digits..).unwrap_or_default();
    }
    rest.is_empty()
}

fn count_digits(text: &[u8]) -> usize {
    text.iter().take_while(|b| b.is_ascii_digit()).count()
}

/// A fixed-size text buffer, so formatting a value costs no heap allocation.
pub struct NumberText {
    bytes: [u8; 40],
    len: usize,
}

impl NumberText {
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

impl std::fmt::Write for NumberText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(std::fmt::Error)?;
        let dest = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dest.copy_from_slice(s.as_bytes());
        self.len = end;
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
    let mut out = NumberText {
        bytes: [0; 40],
        len: 0,
    };
    let magnitude = tokens.abs();
    // Both forms of a finite f64 fit in 40 bytes (the longest is
    // "-2.2250738585072014e-308", 24 bytes), so write! cannot fail; if it
    // somehow did, the buffer would hold a prefix that fails to parse and
    // the caller would refuse it, so the result is checked there.
    let _ = if magnitude == 0.0 || (1e-4..1e15).contains(&magnitude) {
        write!(out, "{tokens}")
    } else {
        write!(out, "{tokens:e}")
    };
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
    }

    proptest! {
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
        fn parsing_agrees_with_the_standard_library_on_valid_text(
            int in "[0-9]{1,10}", frac in "[0-9]{0,10}", exp in -30i32..30,
        ) {
            let text = format!("{int}.{frac}e{exp}");
            prop_assert_eq!(arg(&text), text.parse::<f64>().ok());
        }
    }
}

//! `capacity rate [n]` bytes -> `args::parse_request`, as TB.TAKE, TB.PEEK,
//! TB.REFUND and each group of TB.TAKEALL call it.
//!
//! Input: the first byte is a separator; the rest is split on it into at
//! most three fields `capacity`, `rate`, `n` (the third keeps any further
//! separators, so every byte value can appear in it). Two fields = TB.PEEK
//! without n. Seeds are readable: `|20|2.5|1`.
//!
//! Checked: no panic (overflow checks on); an accepted request is finite and
//! in range (capacity and n at most 2^53, judged on the exact text); acceptance, the value of every field, and which argument an
//! error names all agree with the contract's grammar (a regex) read in
//! argument order.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb_fuzz::args::parse_request;
use tb_fuzz::error::TbError;
use tb_fuzz::{reference_above_2_pow_53, reference_decimal, same};

fuzz_target!(|data: &[u8]| {
    let Some((&separator, rest)) = data.split_first() else {
        return;
    };
    let mut fields = rest.splitn(3, |b| *b == separator);
    let capacity = fields.next().unwrap_or_default();
    let Some(rate) = fields.next() else {
        return;
    };
    let n = fields.next();

    let got = parse_request(capacity, rate, n);

    // The contract, argument by argument, in order.
    let want_capacity = reference_decimal(capacity, false).filter(|v| *v > 0.0);
    let want_rate = reference_decimal(rate, false).filter(|v| *v > 0.0);
    let want_n = match n {
        Some(text) => reference_decimal(text, false),
        None => Some(1.0),
    };
    // Past 2^53 a whole token no longer changes the count. The bound is on
    // the exact text: 9007199254740993 rounds to the double 2^53.
    let too_large = |text: &[u8]| reference_above_2_pow_53(text);
    let expected_error = if want_capacity.is_none() {
        Some(TbError::Capacity)
    } else if too_large(capacity) {
        Some(TbError::CapacityTooLarge)
    } else if want_rate.is_none() {
        Some(TbError::Rate)
    } else if want_n.is_none() {
        Some(TbError::Count)
    } else if n.is_some_and(too_large) {
        Some(TbError::CountTooLarge)
    } else {
        None
    };

    match got {
        Ok(request) => {
            let (c, r, n_value) = (
                request.limit.capacity,
                request.limit.refill_per_sec,
                request.n,
            );
            assert!(c.is_finite() && c > 0.0, "capacity {c:?} accepted");
            assert!(r.is_finite() && r > 0.0, "rate {r:?} accepted");
            assert!(
                n_value.is_finite() && n_value >= 0.0 && n_value.is_sign_positive(),
                "n {n_value:?} accepted"
            );
            assert_eq!(expected_error, None, "accepted, but the contract refuses");
            assert!(
                same(Some(c), want_capacity),
                "capacity {c:?} != {want_capacity:?}"
            );
            assert!(same(Some(r), want_rate), "rate {r:?} != {want_rate:?}");
            assert!(same(Some(n_value), want_n), "n {n_value:?} != {want_n:?}");
        }
        Err(error) => {
            assert_eq!(
                Some(error),
                expected_error,
                "wrong error (or refused a valid request)"
            );
        }
    }
});

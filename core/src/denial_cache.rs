//! The denial cache's priming window (docs/clients.md#the-denial-cache),
//! pure: how long a client library may answer a take as denied, with no
//! round trip, after the server allowed the same take and left too few
//! tokens for another.
//!
//! The module never runs this; the Python, Node and Rust libraries each do,
//! and clients/conformance/vectors/denial_cache.json (written from this
//! function by core/tests/vectors) pins them to one answer.

/// After an allowed take of `n` whose reply left `remaining` whole tokens
/// (`remaining < n`) and a bucket full again in `reset_after_ms`: the same
/// take is denied until the bucket holds `n` again, which is
/// `w = reset_after_ms - ceil((capacity - n) * 1000 / rate)` ms after the
/// reply (the reset is the time to full; the second term the time from `n`
/// tokens to full). The window is `w + 1` ms: the server's tokens are
/// doubles and both terms are rounded up, so the `n`-th token can come back
/// a ms after `w`, and a take sent at `w` would be one more denied call per
/// window.
///
/// 0 (nothing to remember) when the take left `n` or more, the bucket does
/// not refill, or `w` is not a positive finite time (a rate so slow that
/// the second term overflows, say). In doubles, as every library computes
/// it: the reset is at most 2^53 and a second term above it makes `w`
/// negative, so the subtraction is exact wherever it matters.
pub fn primed_denial_ms(
    capacity: f64,
    rate: f64,
    n: f64,
    remaining: i64,
    reset_after_ms: i64,
) -> i64 {
    if rate.is_nan() || rate <= 0.0 || remaining as f64 >= n || reset_after_ms < 0 {
        return 0;
    }
    let from_n_to_full = ((capacity - n) * 1000.0 / rate).ceil();
    let window = reset_after_ms as f64 - from_n_to_full;
    if window.is_finite() && window > 0.0 && window < i64::MAX as f64 {
        (window as i64).saturating_add(1)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_that_leaves_n_primes_nothing() {
        assert_eq!(primed_denial_ms(10.0, 1.0, 1.0, 1, 9000), 0);
    }

    #[test]
    fn the_window_is_the_time_until_n_is_back_plus_one_ms() {
        // 10 tokens at 1 per s, 1 left after a take of 2: 2 tokens in 1 s
        // (9 s to full, 8 s of them from 2 tokens to full).
        assert_eq!(primed_denial_ms(10.0, 1.0, 2.0, 1, 9000), 1001);
    }

    #[test]
    fn no_refill_or_an_overflowing_term_primes_nothing() {
        assert_eq!(primed_denial_ms(10.0, 0.0, 2.0, 1, 9000), 0);
        assert_eq!(
            primed_denial_ms(9_007_199_254_740_992.0, 1e-300, 2.0, 1, 1),
            0
        );
    }
}

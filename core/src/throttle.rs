//! TB.THROTTLE (and `CL.THROTTLE` with `cell-compat`): redis-cell's
//! contract on redis-tb's bucket, pure.
//!
//! redis-cell runs GCRA: an emission interval `T = period / count` and a
//! tolerance `tau = T * (max_burst + 1)`, with one stored number per key,
//! the theoretical arrival time (TAT, Unix ns). A request of `q` is allowed
//! when `max(TAT, now) + q * T - tau <= now`. Written as tokens,
//! `tokens = (tau - (TAT - now)) / T`, capped at `max_burst + 1`: that is a
//! token bucket of capacity `max_burst + 1` refilled at `count / period`
//! per second, so the same limit is the same bucket here. Only the
//! replies' units differ (whole seconds, truncated, as cell reports them).

use crate::args::whole_from;
use crate::bucket::{Limit, Outcome, State};
use crate::error::TbError;
use crate::number::MAX_EXACT_INTEGER;

/// `max_burst count period [quantity]`, validated and as a bucket request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttle {
    pub limit: Limit,
    /// `quantity`, 1 when left out.
    pub n: f64,
}

/// Parses redis-cell's arguments: whole numbers, `max_burst` in
/// [0, 2^53 - 1] (so the capacity `max_burst + 1` is at most 2^53),
/// `count` in [1, 2^53], `period` in [1, 2^53] seconds, `quantity` in
/// [0, 2^53]. Checked in order; the error names the first bad one.
pub fn parse_throttle(
    max_burst: &[u8],
    count: &[u8],
    period: &[u8],
    quantity: Option<&[u8]>,
) -> Result<Throttle, TbError> {
    let max_burst = whole_from(max_burst, 0)
        .filter(|burst| *burst < MAX_EXACT_INTEGER)
        .ok_or(TbError::MaxBurst)?;
    let count = whole_from(count, 1).ok_or(TbError::ThrottleCount)?;
    let period = whole_from(period, 1).ok_or(TbError::Period)?;
    let n = match quantity {
        Some(text) => whole_from(text, 0).ok_or(TbError::Quantity)?,
        None => 1,
    };
    // All four are exact in f64 (at most 2^53); the rate is positive and
    // finite (between 2^-53 and 2^53 per second).
    Ok(Throttle {
        limit: Limit {
            capacity: max_burst.saturating_add(1) as f64,
            refill_per_sec: count as f64 / period as f64,
        },
        n: n as f64,
    })
}

/// redis-cell's reply `[limited, limit, remaining, retry_after,
/// reset_after]` for a bucket outcome: `limit` is the capacity,
/// `retry_after` -1 when allowed (and when the quantity can never fit),
/// else whole seconds; `reset_after` whole seconds. Seconds are truncated,
/// as cell truncates its ns durations.
pub fn reply(outcome: &Outcome, limit: &Limit) -> [i64; 5] {
    let seconds = |ms: i64| ms / 1000;
    [
        i64::from(!outcome.allowed),
        limit.capacity as i64,
        outcome.remaining,
        if outcome.allowed || outcome.retry_after_ms < 0 {
            -1
        } else {
            seconds(outcome.retry_after_ms)
        },
        seconds(outcome.reset_after_ms),
    ]
}

/// The bucket a redis-cell key holds: its TAT (Unix ns, the string cell
/// stores) read at `now_ms`. A TAT at or before now is a full bucket; a
/// later one has used `(TAT - now) / T` tokens of the capacity. Returned
/// as refilled to now, so a write may store it as it is.
///
/// `now_ms` is whole ms rounded down and cell's clock is in ns, so the TAT
/// is read against the end of this millisecond (999,999 ns earlier): a key
/// converted in the millisecond of cell's last write is then the bucket
/// cell left, not one up to 1 ms of refill short (a whole token short after
/// an integral take). The bucket gains at most 1 ms of refill from it, once.
/// In doubles, operation for operation as lua/tb.lua does it.
pub fn from_cell(tat_ns: i64, limit: &Limit, now_ms: i64) -> State {
    let tat_ms = (tat_ns as f64 - 999_999.0) / 1e6;
    let ahead_ms = (tat_ms - now_ms as f64).max(0.0);
    let used = ahead_ms / 1000.0 * limit.refill_per_sec;
    State {
        tokens: (limit.capacity - used).min(limit.capacity),
        last_refill_ms: now_ms as f64,
    }
}

/// Parses a redis-cell value: an integer (its TAT in ns), as cell writes
/// it with `SET`. `None` for anything else.
pub fn parse_tat(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: i64 = 0;
    for digit in digits {
        value = value
            .checked_mul(10)?
            .checked_add(i64::from(digit.wrapping_sub(b'0')))?;
    }
    Some(if negative {
        value.checked_neg()?
    } else {
        value
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::take;

    const NOW: i64 = 1_700_000_000_000;

    fn throttle(burst: &str, count: &str, period: &str, quantity: Option<&str>) -> Throttle {
        parse_throttle(
            burst.as_bytes(),
            count.as_bytes(),
            period.as_bytes(),
            quantity.map(str::as_bytes),
        )
        .unwrap()
    }

    #[test]
    fn cells_arguments_become_a_bucket() {
        let got = throttle("15", "30", "60", None);
        assert_eq!(got.limit.capacity, 16.0);
        assert_eq!(got.limit.refill_per_sec, 0.5);
        assert_eq!(got.n, 1.0);
        assert_eq!(throttle("0", "1", "1", Some("0")).n, 0.0);
    }

    #[test]
    fn the_first_bad_throttle_argument_is_named() {
        let parse = |b: &str, c: &str, p: &str, q: &str| {
            parse_throttle(b.as_bytes(), c.as_bytes(), p.as_bytes(), Some(q.as_bytes()))
        };
        assert_eq!(parse("-1", "x", "x", "x"), Err(TbError::MaxBurst));
        assert_eq!(
            parse("9007199254740992", "1", "1", "1"),
            Err(TbError::MaxBurst)
        );
        assert_eq!(parse("1", "0", "x", "x"), Err(TbError::ThrottleCount));
        assert_eq!(parse("1", "1", "0", "x"), Err(TbError::Period));
        assert_eq!(parse("1", "1", "1", "1.5"), Err(TbError::Quantity));
        assert!(parse(
            "9007199254740991",
            "9007199254740992",
            "1",
            "9007199254740992"
        )
        .is_ok());
    }

    #[test]
    fn the_reply_is_cells_in_whole_seconds() {
        let limit = throttle("4", "1", "2", None).limit; // 5 tokens, one per 2 s
        let allowed = take(None, &limit, 1.0, NOW);
        assert_eq!(reply(&allowed, &limit), [0, 5, 4, -1, 2]);
        let empty = Some(State {
            tokens: 0.0,
            last_refill_ms: NOW as f64,
        });
        let denied = take(empty, &limit, 1.0, NOW);
        assert_eq!(reply(&denied, &limit), [1, 5, 0, 2, 10]);
        let never = take(None, &limit, 6.0, NOW);
        assert_eq!(reply(&never, &limit)[3], -1);
    }

    #[test]
    fn a_cell_key_is_read_as_the_bucket_it_stands_for() {
        let limit = throttle("9", "1", "1", None).limit; // 10 tokens, 1 per s
        let now_ns = i128::from(NOW) * 1_000_000;
        // Offsets from the end of the millisecond NOW, against which a TAT is read.
        let at =
            |offset_ns: i128| from_cell((now_ns + 999_999 + offset_ns) as i64, &limit, NOW).tokens;
        assert_eq!(
            at(-5_000_000_000),
            10.0,
            "a TAT in the past is a full bucket"
        );
        assert_eq!(at(0), 10.0);
        assert_eq!(at(3_000_000_000), 7.0, "3 s ahead: 3 tokens used");
        assert_eq!(at(10_000_000_000), 0.0);
    }

    #[test]
    fn a_tat_is_an_integer_and_nothing_else() {
        assert_eq!(
            parse_tat(b"1700000000000000000"),
            Some(1_700_000_000_000_000_000)
        );
        assert_eq!(parse_tat(b"-5"), Some(-5));
        for bad in ["", "-", "1.5", "1e9", "99999999999999999999", " 1", "x"] {
            assert_eq!(parse_tat(bad.as_bytes()), None, "{bad:?}");
        }
    }
}

//! The token-bucket arithmetic (`bucket.rs`) on arbitrary numbers: raw f64
//! bit patterns (subnormals, the range edges), everyday values, times from
//! i64::MIN to i64::MAX, stored state far in the past or the future.
//!
//! Inputs are filtered to what can reach the arithmetic in the module:
//! capacity and rate finite and > 0, n finite and >= 0 (as `args.rs`
//! guarantees); stored tokens and last_refill any finite f64 (as
//! `parse_decimal(.., Sign::Allowed)` can return). Built with overflow checks,
//! so an integer overflow is a crash.
//!
//! The first byte chooses the operation:
//! - 0: TB.TAKE / TB.PEEK (`take`), every invariant of `check_take`;
//! - 1: TB.REFUND (`refund`), every invariant of `check_refund`;
//! - 2: TB.TAKEALL (`take_all`) over 1-4 buckets: all or nothing, each
//!   outcome equal to a lone take, the deciding index per the contract;
//! - 3: a sequence of up to 16 takes and refunds on one bucket with the clock
//!   moving forwards (and sometimes back): every step checked, every write
//!   fed to the next step through its stored text, and (at everyday
//!   magnitudes) no more granted than the capacity plus the refill plus the
//!   refunds.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb_fuzz::bucket::{take_all, Charge, Limit, State};
use tb_fuzz::number::{format_tokens, parse_decimal, Sign};
use tb_fuzz::{check_refund, check_take, Reader};

fuzz_target!(|data: &[u8]| {
    let mut input = Reader::new(data);
    let op = input.u8();
    match op % 4 {
        0 => {
            let Some((state, limit, n)) = charge(&mut input) else {
                return;
            };
            let now_ms = input.i64();
            check_take(state, &limit, n, now_ms);
        }
        1 => {
            let Some((state, limit, n)) = charge(&mut input) else {
                return;
            };
            let now_ms = input.i64();
            check_refund(state, &limit, n, now_ms);
        }
        2 => take_all_case(&mut input, usize::from(op >> 2) % 4 + 1),
        _ => sequence(&mut input),
    }
});

fn limit(input: &mut Reader) -> Option<Limit> {
    let capacity = input.f64();
    let refill_per_sec = input.f64();
    let valid = |v: f64| v.is_finite() && v > 0.0;
    (valid(capacity) && valid(refill_per_sec)).then_some(Limit {
        capacity,
        refill_per_sec,
    })
}

/// n as `args.rs` can produce it: finite, >= 0, never -0.
fn request_n(input: &mut Reader) -> Option<f64> {
    let n = input.f64();
    (n.is_finite() && n >= 0.0 && n.is_sign_positive()).then_some(n)
}

/// `None` (missing key) or any finite stored pair.
fn stored(input: &mut Reader) -> Option<Option<State>> {
    if input.u8() % 4 == 0 {
        return Some(None);
    }
    let tokens = input.f64();
    let last_refill_ms = input.f64();
    (tokens.is_finite() && last_refill_ms.is_finite()).then_some(Some(State {
        tokens,
        last_refill_ms,
    }))
}

fn charge(input: &mut Reader) -> Option<(Option<State>, Limit, f64)> {
    let limit = limit(input)?;
    let n = request_n(input)?;
    let state = stored(input)?;
    Some((state, limit, n))
}

fn take_all_case(input: &mut Reader, count: usize) {
    let mut charges = Vec::new();
    for _ in 0..count {
        let Some((state, limit, n)) = charge(input) else {
            return;
        };
        charges.push(Charge {
            state,
            limit,
            n,
            behind: None,
            lock: None,
            options: redis_tb_core::bucket::TakeOptions::PLAIN,
        });
    }
    let now_ms = input.i64();
    let got = take_all(&charges, now_ms);
    let alone: Vec<_> = charges
        .iter()
        .map(|c| check_take(c.state, &c.limit, c.n, now_ms))
        .collect();
    let all_allow = alone.iter().all(|o| o.allowed);
    assert_eq!(got.allowed, all_allow, "all or nothing");
    assert_eq!(got.outcomes.len(), charges.len());
    for ((together, single), charge) in got.outcomes.iter().zip(&alone).zip(&charges) {
        if all_allow {
            assert_eq!(
                together, single,
                "an allowed bucket differs from a lone take"
            );
        } else if single.allowed {
            // Nothing is taken: the bucket is answered as a look (n = 0),
            // whose only write can be a clock repair.
            let look = check_take(charge.state, &charge.limit, 0.0, now_ms);
            assert_eq!(*together, look, "an untaken bucket differs from a look");
        } else {
            assert_eq!(
                together, single,
                "a denying bucket differs from a lone take"
            );
        }
    }
    // The deciding bucket, computed the plain way: first index with the
    // longest wait (-1 longest of all) when denied, the fewest remaining
    // when allowed.
    let expected = if all_allow {
        let fewest = alone.iter().map(|o| o.remaining).min().expect("non-empty");
        alone.iter().position(|o| o.remaining == fewest)
    } else {
        let wait = |r: i64| if r < 0 { i128::MAX } else { i128::from(r) };
        let longest = alone
            .iter()
            .map(|o| wait(o.retry_after_ms))
            .max()
            .expect("non-empty");
        alone.iter().position(|o| wait(o.retry_after_ms) == longest)
    };
    assert_eq!(Some(got.decisive), expected, "wrong deciding bucket");
}

fn sequence(input: &mut Reader) {
    let Some(limit) = limit(input) else {
        return;
    };
    let Some(mut state) = stored(input) else {
        return;
    };
    let start_ms = input.i64();
    let mut now_ms = start_ms;
    // The bucket's content at the start, as the first call sees it.
    let initial = match state {
        Some(s) => s.available_at(&limit, now_ms as f64),
        None => limit.capacity,
    };
    let (mut granted, mut refunded) = (0.0_f64, 0.0_f64);
    // Real time that passed: the sum of the forward clock moves (a step
    // back takes no time; the clock then runs forward from there).
    let mut forward_ms: i64 = 0;
    let mut steps = 0;
    while !input.is_empty() && steps < 16 {
        steps += 1;
        let step = input.u8();
        // Mostly forwards by up to 65 s; 1 in 8 steps goes back (a clock
        // step backwards).
        let gap = i64::from(input.u16());
        if step & 0x70 == 0 {
            now_ms = now_ms.saturating_sub(gap);
        } else {
            let next = now_ms.saturating_add(gap);
            forward_ms += next - now_ms;
            now_ms = next;
        }
        let Some(n) = request_n(input) else {
            return;
        };
        let outcome = if step & 1 == 0 {
            let got = check_take(state, &limit, n, now_ms);
            if got.allowed {
                granted += n;
            }
            got
        } else {
            refunded += n;
            check_refund(state, &limit, n, now_ms)
        };
        if let Some(written) = outcome.write {
            // Through the hash: tokens as text, last_refill as integer text.
            let tokens = parse_decimal(format_tokens(written.tokens).as_bytes(), Sign::Allowed);
            let last = parse_decimal(now_ms.to_string().as_bytes(), Sign::Allowed);
            state = Some(State {
                tokens: tokens.expect("written tokens read back"),
                last_refill_ms: last.expect("written last_refill reads back"),
            });
        }
    }
    // Conservation, where f64 rounding cannot blur it: everything granted
    // came from the initial content, the refill over the real time that
    // passed and the refunds. A clock step back must not refill twice.
    let everyday = |v: f64| v <= 1e9;
    if everyday(limit.capacity)
        && everyday(limit.refill_per_sec)
        && start_ms.unsigned_abs() <= 1 << 53
        && now_ms.unsigned_abs() <= 1 << 53
        && (granted + refunded) <= 1e12
    {
        let elapsed_s = forward_ms as f64 / 1000.0;
        // Debt (initial below zero) can leave the budget below zero, where
        // nothing at all is granted.
        let budget = (initial + limit.refill_per_sec * elapsed_s + refunded).max(0.0);
        let slack = 1e-9 * (1.0 + budget + granted);
        assert!(
            granted <= budget + slack,
            "granted {granted} > initial {initial} + refill {} + refunds {refunded}",
            limit.refill_per_sec * elapsed_s
        );
    }
}

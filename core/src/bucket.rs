//! The token bucket itself: pure arithmetic on plain numbers.
//!
//! Nothing here knows about Redis or reads a clock. The caller passes the
//! stored state (if any), the limit, the request and the current time, and
//! gets back what to reply and what (if anything) to store. That keeps every
//! rule testable without a server, and makes the glue in src/bucket/hash.rs a
//! straight line.

use crate::number::MAX_EXACT_INTEGER;

/// A validated limit: both fields finite and strictly positive, the
/// capacity at most `MAX_EXACT_INTEGER as f64` (`args.rs` guarantees it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// Tokens the bucket holds when full: the largest burst.
    pub capacity: f64,
    /// Tokens added per second.
    pub refill_per_sec: f64,
}

/// What a bucket hash stores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct State {
    /// Tokens left at `last_refill_ms`. Hand-edited data may hold anything
    /// finite; negative values count as empty.
    pub tokens: f64,
    /// Unix time in ms of the last write. May lie in the future after a clock
    /// step backwards; then it counts as now (see `seen_at`).
    pub last_refill_ms: f64,
}

/// The answer to one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub allowed: bool,
    /// Whole tokens left after this call (rounded down).
    pub remaining: i64,
    /// 0 when allowed; -1 when `n` exceeds the capacity and can never be
    /// granted; otherwise the fewest whole ms after which the same request
    /// would be allowed.
    pub retry_after_ms: i64,
    /// The fewest whole ms until the bucket is full again (0 when it is).
    pub reset_after_ms: i64,
    /// The state to store, or `None` when nothing may be written. An allowed
    /// request with `n > 0` stores what is left. A denied request (or
    /// `n = 0`) stores nothing, leaving the bucket, its TTL, the AOF and the
    /// replication stream exactly as they were, with one exception: a
    /// `last_refill` in the future is repaired to now (see `seen_at`).
    pub write: Option<State>,
}

impl State {
    /// Tokens available at `now_ms`, per the formula shared with the Lua
    /// script: `min(capacity, tokens + max(0, now - last_refill) / 1000 * rate)`.
    ///
    /// The operations are done in the script's order so both produce the
    /// same doubles. With finite inputs the result is never NaN: an overflow
    /// can only reach +inf, which `min` brings back to the capacity.
    pub fn available_at(&self, limit: &Limit, now_ms: f64) -> f64 {
        let elapsed_ms = (now_ms - self.last_refill_ms).max(0.0);
        let refilled = self.tokens.max(0.0) + elapsed_ms / 1000.0 * limit.refill_per_sec;
        refilled.min(limit.capacity)
    }
}

/// The bucket as every command sees it at `now`, and the repair to store
/// if the stored one cannot stay as it is.
///
/// A missing key is a full bucket: the key expires exactly when the bucket
/// would be full again, so the two are the same thing.
///
/// A `last_refill` later than now (the clock stepped back, say after a
/// failover to a host whose clock is behind) counts as now: the gap is never
/// credited as refill, so no more than the stored tokens can be granted, and
/// refill resumes from the new clock at once. The first write command that
/// sees such a bucket stores it with `last_refill = now`, allowed or denied;
/// otherwise a drained bucket, whose denials write nothing, would stay
/// locked out until the clock caught up, however long that is. This repair
/// is the only write a denied request ever makes.
pub fn seen_at(state: Option<State>, limit: &Limit, now: f64) -> (State, Option<State>) {
    match state {
        None => (
            State {
                tokens: limit.capacity,
                last_refill_ms: now,
            },
            None,
        ),
        Some(stored) if stored.last_refill_ms > now => {
            let current = State {
                tokens: stored.tokens,
                last_refill_ms: now,
            };
            let repaired = State {
                tokens: current.available_at(limit, now),
                last_refill_ms: now,
            };
            (current, Some(repaired))
        }
        Some(stored) => (stored, None),
    }
}

/// The absolute Unix ms at which a bucket written at `now_ms` expires: when
/// it is full again, since a missing key already means "full", so idle
/// buckets cost no memory and nothing is lost. At least 1 ms ahead, as a
/// deadline of now would delete the key being written. Absolute, so every
/// copy (replicas, a reloaded AOF) expires at the same instant.
pub fn expire_at_ms(now_ms: i64, reset_after_ms: i64) -> i64 {
    now_ms.saturating_add(reset_after_ms.max(1))
}

/// Takes `n` tokens if the bucket holds that many at `now_ms`.
pub fn take(state: Option<State>, limit: &Limit, n: f64, now_ms: i64) -> Outcome {
    let now = now_ms as f64;
    let (current, repair) = seen_at(state, limit, now);
    let available = current.available_at(limit, now);

    if available < n {
        let retry_after_ms = if n > limit.capacity {
            -1
        } else {
            first_ms_when(&current, limit, now, n)
        };
        return Outcome {
            allowed: false,
            remaining: floor_to_i64(available),
            retry_after_ms,
            reset_after_ms: first_ms_when(&current, limit, now, limit.capacity),
            write: repair,
        };
    }

    let after = State {
        tokens: available - n,
        last_refill_ms: now,
    };
    granted(after, n, &current, repair, limit, now)
}

/// An allowed call that leaves the bucket at `after`. It stores `after`
/// when it changed the bucket (`n > 0`), else only a clock repair; the time
/// to full counts from what is stored.
fn granted(
    after: State,
    n: f64,
    current: &State,
    repair: Option<State>,
    limit: &Limit,
    now: f64,
) -> Outcome {
    let write = if n > 0.0 { Some(after) } else { repair };
    Outcome {
        allowed: true,
        remaining: floor_to_i64(after.tokens),
        retry_after_ms: 0,
        reset_after_ms: first_ms_when(
            write.as_ref().unwrap_or(current),
            limit,
            now,
            limit.capacity,
        ),
        write,
    }
}

/// TB.TAKE (or TB.PEEK, TB.TAKEALL, a TB.BTAKE that may not wait) on a
/// bucket that TB.BTAKE callers wait on, who together want `queued` tokens.
///
/// The tokens are promised to the queue, first come first served, so
/// nothing is taken (`n = 0` excepted: it takes nothing anyway), however
/// many the bucket holds: otherwise a steady flood of takes could starve a
/// waiter for ever. `remaining` is what is left beyond the queue's share,
/// and `retry_after_ms` an estimate, at this caller's own rate, of when the
/// queue and this request could both be served.
pub fn take_behind(
    state: Option<State>,
    limit: &Limit,
    n: f64,
    queued: f64,
    now_ms: i64,
) -> Outcome {
    if n == 0.0 {
        return take(state, limit, n, now_ms);
    }
    let now = now_ms as f64;
    let (current, repair) = seen_at(state, limit, now);
    let available = current.available_at(limit, now);
    let retry_after_ms = if n > limit.capacity {
        -1
    } else {
        let deficit = queued + n - available;
        clamp_wait((deficit / limit.refill_per_sec * 1000.0).ceil()).max(1)
    };
    Outcome {
        allowed: false,
        remaining: floor_to_i64((available - queued).max(0.0)),
        retry_after_ms,
        reset_after_ms: first_ms_when(&current, limit, now, limit.capacity),
        write: repair,
    }
}

/// What a refund did: the reply and write, and how many tokens it really
/// added (less than asked when the bucket reached its capacity).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refunded {
    pub outcome: Outcome,
    pub added: f64,
}

/// Gives `n` tokens back: refill first, then add, capped at the capacity.
///
/// For a request that failed for reasons of the caller's own. A missing
/// bucket is already full, so refunding into it (or refunding 0) writes
/// nothing, bar the repair of a future `last_refill`.
pub fn refund(state: Option<State>, limit: &Limit, n: f64, now_ms: i64) -> Refunded {
    let now = now_ms as f64;
    if state.is_none() {
        return Refunded {
            outcome: take(None, limit, 0.0, now_ms),
            added: 0.0,
        };
    }
    let (current, repair) = seen_at(state, limit, now);
    let available = current.available_at(limit, now);
    // `available <= capacity` and `n` is finite, so the sum is at most
    // capacity + n, finite; `min` brings it back to the capacity.
    let after = State {
        tokens: (available + n).min(limit.capacity),
        last_refill_ms: now,
    };
    Refunded {
        outcome: granted(after, n, &current, repair, limit, now),
        added: (after.tokens - available).max(0.0),
    }
}

/// One bucket of a multi-limit request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Charge {
    pub state: Option<State>,
    pub limit: Limit,
    pub n: f64,
    /// The tokens TB.BTAKE callers waiting on this bucket want, if any wait
    /// (see `take_behind`).
    pub behind: Option<f64>,
}

impl Charge {
    /// This bucket alone: `take`, or `take_behind` when others wait on it.
    pub fn judge(&self, now_ms: i64) -> Outcome {
        match self.behind {
            Some(queued) => take_behind(self.state, &self.limit, self.n, queued, now_ms),
            None => take(self.state, &self.limit, self.n, now_ms),
        }
    }
}

/// The answer to a multi-limit request: every bucket's own outcome, and the
/// one that decides the reply.
#[derive(Clone, Debug, PartialEq)]
pub struct AllOutcome {
    pub allowed: bool,
    /// Index of the deciding bucket: when denied, the one that makes the
    /// caller wait longest (one that can never allow wins); when allowed,
    /// the one with the fewest tokens left. Ties go to the first.
    pub decisive: usize,
    /// Per bucket, in request order. When any bucket denies, nothing is
    /// taken anywhere: all or nothing (a `write` is then only a clock repair,
    /// see `seen_at`).
    pub outcomes: Vec<Outcome>,
}

/// Takes from every bucket if every bucket allows, else from none.
///
/// Each bucket is judged exactly as a lone `take` at the same instant, so
/// the result equals taking from each one in turn when all allow, and equals
/// taking nothing otherwise. `charges` must not be empty (`args.rs` ensures
/// at least one); an empty list is simply allowed with nothing written.
pub fn take_all(charges: &[Charge], now_ms: i64) -> AllOutcome {
    let mut outcomes: Vec<Outcome> = charges.iter().map(|charge| charge.judge(now_ms)).collect();
    let allowed = outcomes.iter().all(|outcome| outcome.allowed);
    if !allowed {
        // Nothing is taken anywhere: a bucket that would have allowed is
        // answered as a look (n = 0), which writes only a clock repair.
        for (outcome, charge) in outcomes.iter_mut().zip(charges) {
            if outcome.allowed {
                *outcome = take(charge.state, &charge.limit, 0.0, now_ms);
            }
        }
    }
    // A longer wait decides a denial (-1, "never", is the longest); fewer
    // tokens left decide an allowed request.
    let weight = |outcome: &Outcome| {
        if allowed {
            outcome.remaining.saturating_neg()
        } else if outcome.retry_after_ms < 0 {
            i64::MAX
        } else {
            outcome.retry_after_ms
        }
    };
    let mut decisive = 0;
    let mut heaviest = i64::MIN;
    for (index, outcome) in outcomes.iter().enumerate() {
        if weight(outcome) > heaviest {
            heaviest = weight(outcome);
            decisive = index;
        }
    }
    AllOutcome {
        allowed,
        decisive,
        outcomes,
    }
}

/// The fewest whole ms `w` in `[0, MAX_EXACT_INTEGER]` such that `state` holds at
/// least `wanted` tokens at `now + w`, or `MAX_EXACT_INTEGER` if none does.
///
/// A closed formula gives the answer up to rounding; because replies promise
/// an exact wait ("one ms less would be denied"), the guess is then checked
/// against `available_at` itself, the very function a later call will use.
/// `available_at` never decreases with time, so a galloping search around the
/// guess finds the exact edge; in practice the guess is right and this costs
/// two evaluations.
fn first_ms_when(state: &State, limit: &Limit, now: f64, wanted: f64) -> i64 {
    let ready = |wait_ms: i64| state.available_at(limit, now + wait_ms as f64) >= wanted;
    if ready(0) {
        return 0;
    }
    let deficit = wanted - state.available_at(limit, now);
    let guess = clamp_wait((deficit / limit.refill_per_sec * 1000.0).ceil());

    // Bracket the edge, `not_ready < edge <= is_ready`, by galloping away
    // from the guess in steps of 1, 2, 4, ...; `ready(0)` is known false.
    let mut step: i64 = 1;
    let (mut not_ready, mut is_ready) = if ready(guess) {
        let mut is_ready = guess;
        loop {
            let probe = is_ready.saturating_sub(step);
            if probe <= 0 {
                break (0, is_ready);
            }
            if !ready(probe) {
                break (probe, is_ready);
            }
            is_ready = probe;
            step = step.saturating_mul(2);
        }
    } else {
        let mut not_ready = guess;
        loop {
            let probe = not_ready.saturating_add(step);
            if probe >= MAX_EXACT_INTEGER {
                break (not_ready, MAX_EXACT_INTEGER);
            }
            if ready(probe) {
                break (not_ready, probe);
            }
            not_ready = probe;
            step = step.saturating_mul(2);
        }
    };
    // Then halve the bracket down to one ms.
    while is_ready.saturating_sub(not_ready) > 1 {
        let mid = not_ready.saturating_add(is_ready.saturating_sub(not_ready) / 2);
        if ready(mid) {
            is_ready = mid;
        } else {
            not_ready = mid;
        }
    }
    is_ready
}

/// A wait in ms as an integer in `[0, MAX_EXACT_INTEGER]`; NaN (impossible with
/// validated inputs, but cheap to rule out) counts as the maximum.
fn clamp_wait(ms: f64) -> i64 {
    if ms.is_nan() || ms >= MAX_EXACT_INTEGER as f64 {
        MAX_EXACT_INTEGER
    } else if ms <= 0.0 {
        0
    } else {
        ms as i64
    }
}

/// Rounds down to an integer; `as` saturates at the i64 range, so a
/// capacity of 1e300 reports i64::MAX rather than wrapping.
fn floor_to_i64(tokens: f64) -> i64 {
    tokens.floor() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: i64 = 1_700_000_000_000;

    fn limit(capacity: f64, refill_per_sec: f64) -> Limit {
        Limit {
            capacity,
            refill_per_sec,
        }
    }

    fn state(tokens: f64, last_refill_ms: i64) -> Option<State> {
        Some(State {
            tokens,
            last_refill_ms: last_refill_ms as f64,
        })
    }

    /// A charge on a bucket nobody waits on.
    fn charge_of(state: Option<State>, limit: Limit, n: f64) -> Charge {
        Charge {
            state,
            limit,
            n,
            behind: None,
        }
    }

    /// The arithmetic as a table. Each row: stored state (None = missing
    /// key), capacity, rate per second, n, ms since last_refill, then the
    /// expected reply and stored tokens (None = nothing written).
    #[test]
    fn it_follows_the_case_table() {
        type Row = (u32, Option<f64>, f64, f64, f64, i64, [i64; 4], Option<f64>);
        #[rustfmt::skip]
        let rows: &[Row] = &[
            // #  tokens      cap    rate  n     since   [ok, rem, retry, reset]      stored
            ( 1, None,        10.0,  1.0,  1.0,     0, [1, 9, 0, 1000],              Some(9.0)),
            ( 2, None,        10.0,  1.0, 10.0,     0, [1, 0, 0, 10000],             Some(0.0)),
            ( 3, None,        10.0,  1.0, 11.0,     0, [0, 10, -1, 0],               None),
            ( 4, None,        10.0,  1.0,  0.0,     0, [1, 10, 0, 0],                None),
            ( 5, Some(0.0),   10.0,  1.0,  1.0,     0, [0, 0, 1000, 10000],          None),
            ( 6, Some(0.0),   10.0,  1.0,  1.0,   999, [0, 0, 1, 9001],              None),
            ( 7, Some(0.0),   10.0,  1.0,  1.0,  1000, [1, 0, 0, 10000],             Some(0.0)),
            ( 8, Some(0.0),   10.0,  2.0,  1.0,   250, [0, 0, 250, 4750],            None),
            ( 9, Some(2.5),   10.0,  1.0,  1.0,     0, [1, 1, 0, 8500],              Some(1.5)),
            (10, Some(9.0),   10.0,  1.0,  1.0, 60000, [1, 9, 0, 1000],              Some(9.0)),
            (11, Some(0.5),   10.0,  0.5,  1.0,     0, [0, 0, 1000, 19000],          None),
            (12, Some(0.0),    5.0, 20.0,  0.0,    10, [1, 0, 0, 240],               None),
            (13, Some(3.0),   10.0,  1.0,  3.0,     0, [1, 0, 0, 10000],             Some(0.0)),
            // Clock stepped back: a future last_refill counts as now, and is
            // repaired to now even by a denial or n = 0.
            (14, Some(1.0),   10.0,  1.0,  2.0, -5000, [0, 1, 1000, 9000],           Some(1.0)),
            (21, Some(3.0),   10.0,  1.0,  0.0, -60000, [1, 3, 0, 7000],             Some(3.0)),
            (22, Some(0.0),   10.0, 1000.0, 1.0, -60000, [0, 0, 1, 10],              Some(0.0)),
            (23, Some(4.0),   10.0,  1.0,  2.0, -5000, [1, 2, 0, 8000],              Some(2.0)),
            // Hand-edited data: negative tokens count as empty, excess is capped.
            (15, Some(-7.0),  10.0,  1.0,  1.0,     0, [0, 0, 1000, 10000],          None),
            (16, Some(99.0),  10.0,  1.0,  1.0,     0, [1, 9, 0, 1000],              Some(9.0)),
            // Fractional requests and rates.
            (17, None,         1.0,  0.1,  0.25,    0, [1, 0, 0, 2500],              Some(0.75)),
            (18, None,      1000.0, 1e-3,  1.0,     0, [1, 999, 0, 1_000_000],       Some(999.0)),
            // Astronomic refill time is capped, never overflows.
            (19, None,       1e300, 1e-300, 1.0,    0, [1, i64::MAX, 0, 0],          Some(1e300)),
            (20, Some(0.0),  1e300, 1e-300, 1.0,    0, [0, 0, MAX_EXACT_INTEGER, MAX_EXACT_INTEGER], None),
        ];
        println!("#   tokens       cap  rate  n  since -> [allowed remaining retry reset] stored");
        for &(row, tokens, capacity, rate, n, since_ms, expected, stored) in rows {
            println!(
                "{row:<3} {tokens:?} {capacity} {rate} {n} {since_ms} -> {expected:?} {stored:?}"
            );
            let prior = tokens.and_then(|t| state(t, NOW - since_ms));
            let got = take(prior, &limit(capacity, rate), n, NOW);
            let reply = [
                i64::from(got.allowed),
                got.remaining,
                got.retry_after_ms,
                got.reset_after_ms,
            ];
            assert_eq!(reply, expected, "row {row}");
            assert_eq!(got.write.map(|s| s.tokens), stored, "row {row}");
            if let Some(written) = got.write {
                assert_eq!(written.last_refill_ms, NOW as f64, "row {row}");
            }
        }
    }

    #[test]
    fn a_missing_bucket_is_full() {
        let got = take(None, &limit(20.0, 5.0), 0.0, NOW);
        assert_eq!(got.remaining, 20);
        assert_eq!(got.reset_after_ms, 0);
    }

    #[test]
    fn refund_refills_then_adds_capped_at_capacity() {
        let lim = limit(10.0, 1.0);
        let got = refund(state(2.0, NOW - 1000), &lim, 3.0, NOW);
        assert_eq!(got.outcome.write.map(|s| s.tokens), Some(6.0));
        assert_eq!(
            (got.outcome.remaining, got.outcome.reset_after_ms),
            (6, 4000)
        );
        assert_eq!(got.added, 3.0);
        let got = refund(state(9.0, NOW), &lim, 5.0, NOW);
        assert_eq!(got.outcome.write.map(|s| s.tokens), Some(10.0));
        assert_eq!(got.outcome.reset_after_ms, 0);
    }

    #[test]
    fn refund_counts_only_what_it_added() {
        let got = refund(state(9.0, NOW), &limit(10.0, 1.0), 5.0, NOW);
        assert_eq!(got.added, 1.0);
        let got = refund(None, &limit(10.0, 1.0), 5.0, NOW);
        assert_eq!(got.added, 0.0);
    }

    #[test]
    fn refund_repairs_a_future_last_refill() {
        let got = refund(state(2.0, NOW + 60_000), &limit(10.0, 1.0), 0.0, NOW);
        assert_eq!(got.outcome.write, state(2.0, NOW));
        assert_eq!(got.outcome.reset_after_ms, 8000);
    }

    #[test]
    fn a_future_last_refill_counts_as_now_and_is_repaired_once() {
        let lim = limit(10.0, 1000.0);
        let drained = state(0.0, NOW + 60_000);
        let denied = take(drained, &lim, 1.0, NOW);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 1);
        assert_eq!(denied.write, state(0.0, NOW));
        // Once repaired, a denial writes nothing again.
        let again = take(denied.write, &lim, 1.0, NOW);
        assert_eq!(again.write, None);
        assert!(take(denied.write, &lim, 1.0, NOW + 1).allowed);
    }

    #[test]
    fn a_past_or_present_last_refill_is_never_repaired() {
        for since in [0, 1, 60_000] {
            let got = take(state(0.0, NOW - since), &limit(10.0, 1e-9), 1.0, NOW);
            assert_eq!(got.write, None, "since {since}");
        }
    }

    #[test]
    fn a_take_behind_a_queue_is_denied_and_counts_the_queue_ahead() {
        let lim = limit(10.0, 1.0);
        // 10 tokens, 9 of them promised to the queue: 1 is not enough for n = 2,
        // and the queue plus this request need 1 more token: 1 s at 1 per second.
        let got = take_behind(None, &lim, 2.0, 9.0, NOW);
        assert_eq!(
            (got.allowed, got.remaining, got.retry_after_ms, got.write),
            (false, 1, 1000, None)
        );
        // Even with plenty in the bucket, nothing is taken while others wait.
        let got = take_behind(None, &lim, 1.0, 1.0, NOW);
        assert_eq!((got.allowed, got.retry_after_ms), (false, 1));
        assert_eq!(take_behind(None, &lim, 11.0, 1.0, NOW).retry_after_ms, -1);
        assert!(
            take_behind(None, &lim, 0.0, 5.0, NOW).allowed,
            "n = 0 takes nothing"
        );
    }

    #[test]
    fn a_bucket_expires_when_full_and_never_at_once() {
        assert_eq!(expire_at_ms(NOW, 1500), NOW + 1500);
        assert_eq!(expire_at_ms(NOW, 0), NOW + 1);
        assert_eq!(expire_at_ms(i64::MAX - 1, MAX_EXACT_INTEGER), i64::MAX);
    }

    #[test]
    fn refund_into_a_missing_bucket_writes_nothing() {
        let got = refund(None, &limit(10.0, 1.0), 3.0, NOW).outcome;
        assert_eq!(got.write, None);
        assert_eq!(
            (got.allowed, got.remaining, got.reset_after_ms),
            (true, 10, 0)
        );
    }

    #[test]
    fn take_all_names_the_longest_wait_when_denied() {
        let per_second = charge_of(state(0.0, NOW), limit(10.0, 10.0), 1.0);
        let per_day = charge_of(state(0.0, NOW), limit(1000.0, 1000.0 / 86_400.0), 1.0);
        let got = take_all(&[per_second, per_day], NOW);
        assert!(!got.allowed);
        assert_eq!(got.decisive, 1);
        assert_eq!(got.outcomes[1].retry_after_ms, 86_400);
        assert!(got.outcomes.iter().all(|o| o.write.is_none()));
    }

    #[test]
    fn take_all_prefers_a_bucket_that_can_never_allow() {
        let waits = charge_of(state(0.0, NOW), limit(10.0, 0.001), 1.0);
        let never = charge_of(None, limit(1.0, 1.0), 2.0);
        let got = take_all(&[waits, never], NOW);
        assert_eq!((got.allowed, got.decisive), (false, 1));
        assert_eq!(got.outcomes[1].retry_after_ms, -1);
    }

    #[test]
    fn take_all_names_the_tightest_bucket_when_allowed() {
        let roomy = charge_of(None, limit(100.0, 1.0), 1.0);
        let tight = charge_of(None, limit(5.0, 1.0), 1.0);
        let got = take_all(&[roomy, tight], NOW);
        assert!(got.allowed);
        assert_eq!(got.decisive, 1);
        assert_eq!(got.outcomes[1].remaining, 4);
        assert!(got.outcomes.iter().all(|o| o.write.is_some()));
    }

    fn charge() -> impl Strategy<Value = Charge> {
        (
            proptest::option::of((0.0..20.0_f64, 0i64..20_000)),
            1.0..20.0_f64,
            0.01..10.0_f64,
            0.0..10.0_f64,
        )
            .prop_map(|(stored, capacity, rate, n)| {
                let stored = stored.and_then(|(tokens, since)| state(tokens, NOW - since));
                charge_of(stored, limit(capacity, rate), n)
            })
    }

    fn finite_positive() -> impl Strategy<Value = f64> {
        prop_oneof![
            1e-3..1e6_f64,
            (1u32..10_000).prop_map(f64::from),
            Just(f64::MIN_POSITIVE),
            Just(1e300),
        ]
    }

    proptest! {
        #[test]
        fn tokens_stay_between_zero_and_capacity(
            capacity in finite_positive(), rate in finite_positive(),
            tokens in -1e6..1e7_f64, n in 0.0..1e4_f64,
            since_ms in -1_000_000i64..1_000_000_000,
        ) {
            let lim = limit(capacity, rate);
            let got = take(state(tokens, NOW - since_ms), &lim, n, NOW);
            if let Some(written) = got.write {
                prop_assert!(written.tokens >= 0.0 && written.tokens <= capacity);
                prop_assert!(written.tokens.is_finite());
            }
            prop_assert!(got.remaining >= 0);
            prop_assert!(got.retry_after_ms >= -1 && got.retry_after_ms <= MAX_EXACT_INTEGER);
            prop_assert!(got.reset_after_ms >= 0 && got.reset_after_ms <= MAX_EXACT_INTEGER);
        }

        #[test]
        fn granted_tokens_never_exceed_capacity_plus_refill(
            capacity in 1.0..1000.0_f64, rate in 0.01..1000.0_f64,
            calls in proptest::collection::vec((0i64..5_000, 0.0..50.0_f64), 1..60),
        ) {
            let lim = limit(capacity, rate);
            let mut stored: Option<State> = None;
            let mut now = NOW;
            let mut granted = 0.0;
            for (gap_ms, n) in calls {
                now += gap_ms;
                let got = take(stored, &lim, n, now);
                if got.allowed {
                    granted += n;
                }
                if let Some(written) = got.write {
                    stored = Some(written);
                }
            }
            let elapsed_s = (now - NOW) as f64 / 1000.0;
            prop_assert!(granted <= capacity + rate * elapsed_s + 1e-6 * (1.0 + granted));
        }

        #[test]
        fn retry_after_is_exact(
            capacity in 1.0..1e4_f64, rate in 1e-3..1e4_f64,
            tokens in 0.0..1e4_f64, n in 0.0..1e4_f64, since_ms in 0i64..100_000,
        ) {
            let lim = limit(capacity, rate);
            let prior = state(tokens, NOW - since_ms);
            let got = take(prior, &lim, n, NOW);
            if !got.allowed && got.retry_after_ms > 0 && got.retry_after_ms < MAX_EXACT_INTEGER {
                let wait = got.retry_after_ms;
                prop_assert!(take(prior, &lim, n, NOW + wait).allowed);
                prop_assert!(!take(prior, &lim, n, NOW + wait - 1).allowed);
            }
            if got.retry_after_ms == -1 {
                prop_assert!(n > capacity);
            }
        }

        #[test]
        fn reset_after_is_exact(
            capacity in 1.0..1e4_f64, rate in 1e-3..1e4_f64,
            tokens in 0.0..1e4_f64, n in 0.0..1e4_f64, since_ms in 0i64..100_000,
        ) {
            let lim = limit(capacity, rate);
            let got = take(state(tokens, NOW - since_ms), &lim, n, NOW);
            if let Some(written) = got.write {
                let reset = got.reset_after_ms;
                prop_assert!(written.available_at(&lim, (NOW + reset) as f64) >= capacity);
                if reset > 0 {
                    prop_assert!(written.available_at(&lim, (NOW + reset - 1) as f64) < capacity);
                }
            }
        }

        #[test]
        fn denied_or_empty_requests_write_nothing(
            capacity in finite_positive(), rate in finite_positive(),
            tokens in 0.0..1e4_f64, n in 0.0..1e4_f64, since_ms in 0i64..100_000,
        ) {
            let got = take(state(tokens, NOW - since_ms), &limit(capacity, rate), n, NOW);
            if !got.allowed || n == 0.0 {
                prop_assert!(got.write.is_none(), "since_ms >= 0: nothing to repair");
            }
        }

        #[test]
        fn take_all_equals_taking_from_each_only_when_all_allow(
            charges in proptest::collection::vec(charge(), 1..5),
        ) {
            let got = take_all(&charges, NOW);
            let alone: Vec<Outcome> = charges
                .iter()
                .map(|c| take(c.state, &c.limit, c.n, NOW))
                .collect();
            let all_allow = alone.iter().all(|o| o.allowed);
            prop_assert_eq!(got.allowed, all_allow);
            for ((together, single), c) in got.outcomes.iter().zip(&alone).zip(&charges) {
                if all_allow {
                    prop_assert_eq!(together, single);
                } else {
                    // Nothing taken: at most a clock repair.
                    prop_assert_eq!(together.write, seen_at(c.state, &c.limit, NOW as f64).1);
                }
            }
            prop_assert!(got.decisive < charges.len());
            prop_assert_eq!(got.outcomes[got.decisive].allowed, got.allowed);
        }

        #[test]
        fn refund_keeps_tokens_within_capacity(
            capacity in finite_positive(), rate in finite_positive(),
            tokens in -1e6..1e7_f64, n in 0.0..1e7_f64, since_ms in -100_000i64..1_000_000,
        ) {
            let got = refund(state(tokens, NOW - since_ms), &limit(capacity, rate), n, NOW).outcome;
            if let Some(written) = got.write {
                prop_assert!(written.tokens >= 0.0 && written.tokens <= capacity);
            }
        }

        #[test]
        fn extreme_inputs_never_panic(
            capacity in prop::num::f64::POSITIVE | prop::num::f64::SUBNORMAL,
            rate in prop::num::f64::POSITIVE | prop::num::f64::SUBNORMAL,
            tokens in prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL | prop::num::f64::ZERO,
            last in prop::num::f64::NORMAL | prop::num::f64::ZERO,
            n in prop::num::f64::POSITIVE | prop::num::f64::ZERO,
            now_ms in any::<i64>(),
        ) {
            prop_assume!(capacity.is_finite() && capacity > 0.0);
            prop_assume!(rate.is_finite() && rate > 0.0 && n.is_finite());
            let prior = Some(State { tokens, last_refill_ms: last });
            let got = take(prior, &limit(capacity, rate), n, now_ms);
            prop_assert!(got.reset_after_ms >= 0 && got.reset_after_ms <= MAX_EXACT_INTEGER);
            prop_assert!(got.retry_after_ms >= -1 && got.retry_after_ms <= MAX_EXACT_INTEGER);
            if let Some(written) = got.write {
                prop_assert!(written.tokens.is_finite() && written.tokens >= 0.0);
            }
        }
    }
}

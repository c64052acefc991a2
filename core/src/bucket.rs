//! The token bucket itself: pure arithmetic on plain numbers.
//!
//! Nothing here knows about Redis or reads a clock. The caller passes the
//! stored state (if any), the limit, the request and the current time, and
//! gets back what to reply and what (if anything) to store. That keeps every
//! rule testable without a server, and makes the glue in src/bucket/hash.rs a
//! straight line.

use crate::lockout::{self, Block, Lock};
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
    /// Tokens left at `last_refill_ms`. Below zero is debt, left by a
    /// reservation (`MAXWAIT`) or a charge (TB.CHARGE): refill repays it
    /// before any token can be taken. Hand-edited data may hold anything
    /// finite.
    pub tokens: f64,
    /// Unix time in ms of the last write. May lie in the future after a clock
    /// step backwards; then it counts as now (see `seen_at`).
    pub last_refill_ms: f64,
}

/// The answer to one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub allowed: bool,
    /// Whole tokens left after this call (rounded down, never below 0).
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
    /// replication stream exactly as they were, with two exceptions: a
    /// `last_refill` in the future is repaired to now (see `seen_at`), and
    /// the denial that starts a lock stores it (`lock`).
    pub write: Option<State>,
    /// A lock to store with `write` (which is then `Some`): the one this
    /// denial started (`lockout::start`). `None` leaves the lock fields as
    /// they are.
    pub lock: Option<Lock>,
}

/// The options of TB.TAKE and TB.TAKEALL (`args::parse_take_options`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TakeOptions {
    /// `MAXWAIT ms`: a call that would be denied is allowed into debt when
    /// the missing tokens arrive within this many ms (0: never).
    pub max_wait_ms: i64,
    /// `BLOCK ms [MAXBLOCK ms]`: a denial locks the key.
    pub block: Option<Block>,
}

impl TakeOptions {
    /// No option given: plain TB.TAKE.
    pub const PLAIN: TakeOptions = TakeOptions {
        max_wait_ms: 0,
        block: None,
    };

    /// `MAXWAIT max_wait_ms`, and `BLOCK block_ms MAXBLOCK max_block_ms`
    /// where `block` is `Some((block_ms, max_block_ms))`.
    pub fn new(max_wait_ms: i64, block: Option<(i64, i64)>) -> TakeOptions {
        TakeOptions {
            max_wait_ms,
            block: block.map(|(block_ms, max_block_ms)| Block {
                block_ms,
                max_block_ms,
            }),
        }
    }
}

impl State {
    /// Tokens available at `now_ms`, per the formula shared with the Lua
    /// script: `min(capacity, tokens + max(0, now - last_refill) / 1000 * rate)`.
    /// Debt (tokens below zero) is repaid by the same refill. No call can
    /// leave more than 2^53 of it (MAXDEBT and the capacity are bounded so);
    /// a deeper hand-edited value counts as 2^53: `max(tokens, -2^53)`.
    ///
    /// The operations are done in the script's order so both produce the
    /// same doubles. With finite inputs the result is never NaN: an overflow
    /// can only reach +inf, which `min` brings back to the capacity.
    pub fn available_at(&self, limit: &Limit, now_ms: f64) -> f64 {
        let elapsed_ms = (now_ms - self.last_refill_ms).max(0.0);
        let tokens = self.tokens.max(-(MAX_EXACT_INTEGER as f64));
        let refilled = tokens + elapsed_ms / 1000.0 * limit.refill_per_sec;
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
            remaining: remaining_of(available),
            retry_after_ms,
            reset_after_ms: first_ms_when(&current, limit, now, limit.capacity),
            write: repair,
            lock: None,
        };
    }

    let after = State {
        tokens: available - n,
        last_refill_ms: now,
    };
    granted(after, n, &current, repair, limit, now)
}

/// TB.TAKE with its options, on a bucket whose hash holds `lock` (if any).
///
/// In order: a lock that still holds denies (`locked`); then the plain
/// take, or a reservation (`reserve`) when `MAXWAIT` is given; then, if
/// that denies and `BLOCK` is given, the denial starts a lock
/// (`lock_on_denial`). Without options and without a stored lock this is
/// exactly `take`: the same reply, the same bytes.
pub fn take_with(
    state: Option<State>,
    lock: Option<Lock>,
    limit: &Limit,
    n: f64,
    options: &TakeOptions,
    now_ms: i64,
) -> Outcome {
    if lock.is_none() && *options == TakeOptions::PLAIN {
        return take(state, limit, n, now_ms); // the usual call, at its old cost
    }
    if let Some(held) = lock.filter(|lock| lock.holds_at(now_ms)) {
        return locked(state, &held, limit, n, options.max_wait_ms, now_ms);
    }
    let outcome = reserve(state, limit, n, options.max_wait_ms, now_ms);
    lock_on_denial(outcome, state, lock, limit, options, now_ms)
}

/// The answer on a key whose lock holds: denied, whatever the bucket holds
/// (even for `n = 0`), writing nothing but a clock repair. The wait is the
/// later of the lock's end and the time the same call would have its
/// tokens: the soonest it could succeed.
pub fn locked(
    state: Option<State>,
    lock: &Lock,
    limit: &Limit,
    n: f64,
    max_wait_ms: i64,
    now_ms: i64,
) -> Outcome {
    let unlocked = reserve(state, limit, n, max_wait_ms, now_ms);
    let tokens_ms = if unlocked.allowed {
        0
    } else {
        unlocked.retry_after_ms
    };
    let now = now_ms as f64;
    let (current, repair) = seen_at(state, limit, now);
    Outcome {
        allowed: false,
        remaining: remaining_of(current.available_at(limit, now)),
        retry_after_ms: match tokens_ms {
            -1 => -1,
            tokens_ms => tokens_ms.max(lock.ms_left(now_ms)),
        },
        reset_after_ms: first_ms_when(&current, limit, now, limit.capacity),
        write: repair,
        lock: None,
    }
}

/// A denial of a call with `BLOCK` starts a lock (the next strike of the
/// stored `lock` if its probation has not ended). It stores the lock with
/// the bucket as it stands now, and waits at least until the lock ends.
/// Anything else passes unchanged.
pub fn lock_on_denial(
    outcome: Outcome,
    state: Option<State>,
    lock: Option<Lock>,
    limit: &Limit,
    options: &TakeOptions,
    now_ms: i64,
) -> Outcome {
    let Some(block) = options.block.filter(|_| !outcome.allowed) else {
        return outcome;
    };
    let started = lockout::start(lock, &block, now_ms);
    let now = now_ms as f64;
    let current = State::current(state, limit, now_ms);
    let stored = State {
        tokens: current.available_at(limit, now),
        last_refill_ms: now,
    };
    Outcome {
        retry_after_ms: match outcome.retry_after_ms {
            -1 => -1,
            tokens_ms => tokens_ms.max(started.ms_left(now_ms)),
        },
        reset_after_ms: first_ms_when(&stored, limit, now, limit.capacity),
        write: Some(stored),
        lock: Some(started),
        ..outcome
    }
}

/// `take` with `MAXWAIT max_wait_ms`: a reservation.
///
/// With `t` the tokens after refill: `t >= n` is a plain take. Otherwise,
/// if `n` fits the capacity and the bucket will hold `n` within
/// `max_wait_ms`, the call is allowed into debt (`t - n < 0`) and told to
/// act after `retry_after_ms`, when the debt is repaid. Each reservation
/// deepens the debt, so the next one waits longer: they go in arrival
/// order. Else it is denied, writing nothing, with the soonest a call with
/// the same `MAXWAIT` would be allowed. `max_wait_ms = 0` is `take`.
pub fn reserve(
    state: Option<State>,
    limit: &Limit,
    n: f64,
    max_wait_ms: i64,
    now_ms: i64,
) -> Outcome {
    let plain = take(state, limit, n, now_ms);
    if plain.allowed || max_wait_ms <= 0 || n > limit.capacity {
        return plain;
    }
    let now = now_ms as f64;
    let (current, _) = seen_at(state, limit, now);
    let horizon = now + max_wait_ms as f64;
    if current.available_at(limit, horizon) < n {
        return Outcome {
            retry_after_ms: first_ms_when(&current, limit, horizon, n),
            ..plain
        };
    }
    let after = State {
        tokens: current.available_at(limit, now) - n,
        last_refill_ms: now,
    };
    Outcome {
        allowed: true,
        remaining: 0,
        // Rounding may put the repayment a ms past the horizon the check
        // above saw; the promise is "within MAXWAIT".
        retry_after_ms: first_ms_when(&after, limit, now, 0.0).clamp(1, max_wait_ms),
        reset_after_ms: first_ms_when(&after, limit, now, limit.capacity),
        write: Some(after),
        lock: None,
    }
}

/// TB.CHARGE: takes `n` whatever the bucket holds (a cost learned after
/// the work), into debt down to `-max_debt` and no further. A balance
/// already below `-max_debt` (left by a larger `MAXDEBT`) stays as it is,
/// never raised. Always allowed; `retry_after_ms` is the wait until the
/// debt is repaid (0 when there is none). `n = 0` writes nothing but a
/// clock repair.
pub fn debit(state: Option<State>, limit: &Limit, n: f64, max_debt: f64, now_ms: i64) -> Outcome {
    debited(state, limit, n, max_debt, now_ms).outcome
}

/// What a charge did: the reply and write, and how many tokens it really
/// took (less than asked once the debt floor held, 0 when the balance was
/// already below it): the charge's twin of `Refunded`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Debited {
    pub outcome: Outcome,
    pub charged: f64,
}

/// `debit`, with how many tokens it really took.
pub fn debited(state: Option<State>, limit: &Limit, n: f64, max_debt: f64, now_ms: i64) -> Debited {
    let now = now_ms as f64;
    let (current, repair) = seen_at(state, limit, now);
    let available = current.available_at(limit, now);
    let floor = -max_debt;
    let tokens = if available <= floor {
        available
    } else {
        (available - n).max(floor)
    };
    let write = if n > 0.0 {
        Some(State {
            tokens,
            last_refill_ms: now,
        })
    } else {
        repair
    };
    let shown = write.unwrap_or(current);
    Debited {
        outcome: Outcome {
            allowed: true,
            remaining: remaining_of(shown.available_at(limit, now)),
            retry_after_ms: first_ms_when(&shown, limit, now, 0.0),
            reset_after_ms: first_ms_when(&shown, limit, now, limit.capacity),
            write,
            lock: None,
        },
        // Both finite: `available` is at most the capacity, `tokens` at
        // least -2^53 or `available`.
        charged: if n > 0.0 {
            (available - tokens).max(0.0)
        } else {
            0.0
        },
    }
}

/// The absolute Unix ms at which a bucket written with `outcome` expires:
/// when it is full again (`expire_at_ms`), but never before the probation
/// of its lock (the one written, else the one stored) ends, so the strikes
/// are kept as long as they count.
pub fn deadline_ms(now_ms: i64, outcome: &Outcome, stored_lock: Option<Lock>) -> i64 {
    let full = expire_at_ms(now_ms, outcome.reset_after_ms);
    match outcome.lock.or(stored_lock) {
        Some(lock) => full.max(lock.probation_until_ms),
        None => full,
    }
}

impl State {
    /// The bucket as seen at `now_ms`: a missing key is full, a future
    /// `last_refill` counts as now (see `seen_at`).
    fn current(state: Option<State>, limit: &Limit, now_ms: i64) -> State {
        seen_at(state, limit, now_ms as f64).0
    }
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
        remaining: remaining_of(after.tokens),
        retry_after_ms: 0,
        reset_after_ms: first_ms_when(
            write.as_ref().unwrap_or(current),
            limit,
            now,
            limit.capacity,
        ),
        write,
        lock: None,
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
        remaining: remaining_of(available - queued),
        retry_after_ms,
        reset_after_ms: first_ms_when(&current, limit, now, limit.capacity),
        write: repair,
        lock: None,
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
    /// The lock stored in the bucket's hash, if any.
    pub lock: Option<Lock>,
    /// The call's options (TB.TAKEALL's apply to every bucket).
    pub options: TakeOptions,
}

impl Charge {
    /// This bucket alone: `take_with`, or `take_behind` when others wait
    /// on it. A lock holds before anything else, and a denial with `BLOCK`
    /// starts one, queue or not.
    pub fn judge(&self, now_ms: i64) -> Outcome {
        let Some(queued) = self.behind else {
            return take_with(
                self.state,
                self.lock,
                &self.limit,
                self.n,
                &self.options,
                now_ms,
            );
        };
        if let Some(held) = self.lock.filter(|lock| lock.holds_at(now_ms)) {
            return locked(
                self.state,
                &held,
                &self.limit,
                self.n,
                self.options.max_wait_ms,
                now_ms,
            );
        }
        let outcome = take_behind(self.state, &self.limit, self.n, queued, now_ms);
        lock_on_denial(
            outcome,
            self.state,
            self.lock,
            &self.limit,
            &self.options,
            now_ms,
        )
    }
}

/// The answer to a multi-limit request: every bucket's own outcome, and the
/// one that decides the reply.
#[derive(Clone, Debug, PartialEq)]
pub struct AllOutcome {
    pub allowed: bool,
    /// Index of the deciding bucket: when denied, the one that makes the
    /// caller wait longest (one that can never allow wins); when allowed,
    /// the one whose reservation waits longest, then the one with the
    /// fewest tokens left. Ties go to the first.
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
    // A longer wait decides a denial (-1, "never", is the longest); an
    // allowed call is decided by the longest reservation wait, then by the
    // fewest tokens left.
    let weight = |outcome: &Outcome| {
        if allowed {
            (outcome.retry_after_ms, outcome.remaining.saturating_neg())
        } else if outcome.retry_after_ms < 0 {
            (i64::MAX, 0)
        } else {
            (outcome.retry_after_ms, 0)
        }
    };
    let mut decisive = 0;
    let mut heaviest = (i64::MIN, i64::MIN);
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
/// two evaluations. Public as a rule of its own: the client libraries'
/// local limiters repeat it, and clients/conformance/vectors/first_ms_when.json
/// pins them to it.
pub fn first_ms_when(state: &State, limit: &Limit, now: f64, wanted: f64) -> i64 {
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

/// `remaining` of a reply: whole tokens, and 0 for a bucket in debt.
fn remaining_of(tokens: f64) -> i64 {
    floor_to_i64(tokens.max(0.0))
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
            lock: None,
            options: TakeOptions::PLAIN,
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
            // Below zero is debt, repaid by refill first; excess is capped.
            (15, Some(-7.0),  10.0,  1.0,  1.0,     0, [0, 0, 8000, 17000],          None),
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

    #[test]
    fn a_reservation_goes_into_debt_and_says_when_to_act() {
        let lim = limit(10.0, 1.0);
        // Empty: 1 token arrives in 1000 ms, within MAXWAIT 1500.
        let got = reserve(state(0.0, NOW), &lim, 1.0, 1500, NOW);
        assert_eq!(
            (got.allowed, got.remaining, got.retry_after_ms),
            (true, 0, 1000)
        );
        assert_eq!(got.write.map(|s| s.tokens), Some(-1.0));
        assert_eq!(got.reset_after_ms, 11_000);
        // The next one queues behind it: 2000 ms, past MAXWAIT 1500.
        let next = reserve(got.write, &lim, 1.0, 1500, NOW);
        assert!(!next.allowed);
        assert_eq!(next.write, None, "a denied reservation writes nothing");
        assert_eq!(next.retry_after_ms, 500, "allowed once 2000 - 1500 ms pass");
        assert!(reserve(got.write, &lim, 1.0, 1500, NOW + 500).allowed);
        assert!(!reserve(got.write, &lim, 1.0, 1500, NOW + 499).allowed);
    }

    #[test]
    fn maxwait_0_and_requests_past_the_capacity_are_plain_takes() {
        let lim = limit(10.0, 1.0);
        let empty = state(0.0, NOW);
        assert_eq!(
            reserve(empty, &lim, 1.0, 0, NOW),
            take(empty, &lim, 1.0, NOW)
        );
        let never = reserve(None, &lim, 11.0, 1_000_000, NOW);
        assert_eq!((never.allowed, never.retry_after_ms), (false, -1));
        // Enough tokens: no wait, no debt.
        let plain = reserve(None, &lim, 3.0, 500, NOW);
        assert_eq!((plain.allowed, plain.retry_after_ms), (true, 0));
    }

    #[test]
    fn debt_is_repaid_before_a_take_is_allowed() {
        let lim = limit(10.0, 1.0);
        let owed = state(-2.0, NOW);
        let got = take(owed, &lim, 1.0, NOW);
        assert_eq!(
            (got.allowed, got.remaining, got.retry_after_ms),
            (false, 0, 3000)
        );
        assert!(take(owed, &lim, 1.0, NOW + 3000).allowed);
    }

    #[test]
    fn a_charge_always_takes_down_to_maxdebt() {
        let lim = limit(10.0, 2.0);
        let got = debit(None, &lim, 4.0, 10.0, NOW);
        assert_eq!(
            (got.allowed, got.remaining, got.retry_after_ms),
            (true, 6, 0)
        );
        let deep = debit(state(1.0, NOW), &lim, 50.0, 10.0, NOW);
        assert_eq!(
            deep.write.map(|s| s.tokens),
            Some(-10.0),
            "stops at -MAXDEBT"
        );
        assert_eq!((deep.remaining, deep.retry_after_ms), (0, 5000));
        assert_eq!(deep.reset_after_ms, 10_000);
        // A deeper debt (a larger MAXDEBT before) is never raised.
        let deeper = debit(state(-30.0, NOW), &lim, 1.0, 10.0, NOW);
        assert_eq!(deeper.write.map(|s| s.tokens), Some(-30.0));
        assert_eq!(debit(state(3.0, NOW), &lim, 0.0, 10.0, NOW).write, None);
    }

    /// The INFO counter of charges counts what was taken: all of `n`, or
    /// down to the floor, or nothing below it.
    #[test]
    fn a_charge_counts_what_it_took_not_what_was_asked() {
        let lim = limit(10.0, 1.0);
        assert_eq!(debited(None, &lim, 4.0, 10.0, NOW).charged, 4.0);
        assert_eq!(
            debited(state(1.0, NOW), &lim, 50.0, 10.0, NOW).charged,
            11.0
        );
        assert_eq!(
            debited(state(-30.0, NOW), &lim, 1.0, 10.0, NOW).charged,
            0.0
        );
        assert_eq!(debited(state(3.0, NOW), &lim, 0.0, 10.0, NOW).charged, 0.0);
        let asked = debited(None, &limit(10_000.0, 0.001), 150_000.0, 10_000.0, NOW);
        assert_eq!(asked.charged, 20_000.0);
        assert_eq!(
            asked.outcome,
            debit(None, &limit(10_000.0, 0.001), 150_000.0, 10_000.0, NOW)
        );
    }

    #[test]
    fn a_denial_with_block_locks_the_key() {
        let lim = limit(5.0, 1.0);
        let opts = TakeOptions::new(0, Some((10_000, 10_000)));
        let got = take_with(state(0.0, NOW), None, &lim, 1.0, &opts, NOW);
        assert!(!got.allowed);
        let lock = got.lock.expect("the denial starts a lock");
        assert_eq!((lock.until_ms, lock.strikes), (NOW + 10_000, 1));
        assert_eq!(got.retry_after_ms, 10_000, "the lock outlasts the refill");
        assert_eq!(got.write, state(0.0, NOW));
        // During the lock even a full bucket denies, and writes nothing.
        let later = NOW + 9_000;
        let during = take_with(got.write, Some(lock), &lim, 1.0, &TakeOptions::PLAIN, later);
        assert_eq!(
            (during.allowed, during.write, during.lock),
            (false, None, None)
        );
        assert_eq!((during.remaining, during.retry_after_ms), (5, 1000));
        let peek = take_with(got.write, Some(lock), &lim, 0.0, &TakeOptions::PLAIN, later);
        assert!(!peek.allowed, "n = 0 is denied too");
        // After it, a take goes through and the lock stays for its probation.
        let after = take_with(got.write, Some(lock), &lim, 1.0, &opts, NOW + 10_000);
        assert!(after.allowed && after.lock.is_none());
        assert_eq!(deadline_ms(NOW + 10_000, &after, Some(lock)), NOW + 20_000);
    }

    #[test]
    fn the_wait_of_a_locked_denial_is_the_later_of_lock_and_tokens() {
        let lim = limit(10.0, 0.1); // a token per 10 s
        let opts = TakeOptions::new(0, Some((2_000, 2_000)));
        let got = take_with(state(0.0, NOW), None, &lim, 1.0, &opts, NOW);
        assert_eq!(got.retry_after_ms, 10_000, "tokens come after the lock");
        let during = take_with(got.write, got.lock, &lim, 1.0, &opts, NOW + 1_000);
        assert_eq!(during.retry_after_ms, 9_000);
        let never = take_with(got.write, got.lock, &lim, 11.0, &opts, NOW + 1_000);
        assert_eq!(never.retry_after_ms, -1);
    }

    #[test]
    fn without_block_a_denial_never_locks() {
        let got = take_with(
            state(0.0, NOW),
            None,
            &limit(5.0, 1.0),
            1.0,
            &TakeOptions::PLAIN,
            NOW,
        );
        assert_eq!((got.allowed, got.write, got.lock), (false, None, None));
    }

    #[test]
    fn plain_calls_equal_take() {
        for prior in [None, state(0.0, NOW), state(3.5, NOW - 700)] {
            for n in [0.0, 1.0, 4.0, 11.0] {
                let lim = limit(10.0, 2.0);
                assert_eq!(
                    take_with(prior, None, &lim, n, &TakeOptions::PLAIN, NOW),
                    take(prior, &lim, n, NOW)
                );
            }
        }
    }

    #[test]
    fn take_all_waits_for_its_longest_reservation() {
        let opts = TakeOptions::new(5_000, None);
        let mut short = charge_of(state(0.0, NOW), limit(10.0, 1.0), 1.0);
        let mut long = charge_of(state(0.0, NOW), limit(10.0, 0.5), 1.0);
        short.options = opts;
        long.options = opts;
        let got = take_all(&[short, long], NOW);
        assert!(got.allowed);
        assert_eq!((got.decisive, got.outcomes[1].retry_after_ms), (1, 2000));
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
                // Debt stays debt (only refill repays it); a take never adds any.
                prop_assert!(written.tokens >= tokens.min(0.0) && written.tokens <= capacity);
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

        /// Reservations at the same rate, in arrival order, against a model
        /// that knows only the rule: each caller acts when every token
        /// granted before it, and its own, has been refilled.
        #[test]
        fn reservations_are_served_in_arrival_order(
            capacity in 1.0..50.0_f64, rate in 0.05..100.0_f64,
            max_wait_ms in 0i64..60_000,
            calls in proptest::collection::vec((0i64..2_000, 0.0..5.0_f64), 1..40),
        ) {
            let lim = limit(capacity, rate);
            let mut stored: Option<State> = None;
            let mut now = NOW;
            let mut last_go: i64 = i64::MIN;
            for (gap_ms, n) in calls {
                now += gap_ms;
                let got = reserve(stored, &lim, n, max_wait_ms, now);
                if got.allowed && n > 0.0 {
                    let go = now + got.retry_after_ms;
                    // Later callers never act before earlier ones (1 ms of rounding).
                    prop_assert!(go + 1 >= last_go, "go {go} before {last_go}");
                    last_go = last_go.max(go);
                    prop_assert!(got.retry_after_ms <= max_wait_ms);
                }
                if let Some(written) = got.write {
                    // Never deeper than MAXWAIT's worth of refill allows.
                    let floor = -(rate * max_wait_ms as f64 / 1000.0);
                    prop_assert!(written.tokens >= floor - 1e-9 * (1.0 + floor.abs()));
                    stored = Some(written);
                }
                if !got.allowed {
                    prop_assert!(got.write.is_none());
                }
            }
        }

        #[test]
        fn a_charge_never_leaves_the_balance_below_minus_maxdebt(
            capacity in 1.0..1e4_f64, rate in 1e-3..1e3_f64, max_debt in 0.0..1e4_f64,
            calls in proptest::collection::vec((0i64..5_000, 0.0..1e4_f64), 1..30),
        ) {
            let lim = limit(capacity, rate);
            let mut stored: Option<State> = None;
            let mut now = NOW;
            for (gap_ms, n) in calls {
                now += gap_ms;
                let got = debit(stored, &lim, n, max_debt, now);
                prop_assert!(got.allowed && got.remaining >= 0);
                if let Some(written) = got.write {
                    prop_assert!(written.tokens >= -max_debt && written.tokens <= capacity);
                    prop_assert_eq!(got.retry_after_ms == 0, written.tokens >= 0.0);
                    stored = Some(written);
                }
            }
        }

        #[test]
        fn a_denial_without_block_writes_nothing(
            capacity in 1.0..1e4_f64, rate in 1e-3..1e4_f64, tokens in -1e4..1e4_f64,
            n in 0.0..1e4_f64, since_ms in 0i64..100_000, max_wait_ms in 0i64..100_000,
            lock_left in proptest::option::of(-10_000i64..10_000),
        ) {
            let lock = lock_left.map(|left| Lock {
                until_ms: NOW + left,
                strikes: 1,
                probation_until_ms: NOW + left.max(0) + 10_000,
            });
            let got = take_with(
                state(tokens, NOW - since_ms), lock, &limit(capacity, rate), n,
                &TakeOptions::new(max_wait_ms, None), NOW,
            );
            if !got.allowed {
                prop_assert!(got.write.is_none() && got.lock.is_none());
            }
            if lock.is_some_and(|lock| lock.holds_at(NOW)) {
                prop_assert!(!got.allowed);
            }
        }

        #[test]
        fn a_locked_denial_waits_until_the_same_call_could_succeed(
            capacity in 1.0..100.0_f64, rate in 0.01..100.0_f64, tokens in -50.0..0.5_f64,
            share in 0.01..=1.0_f64, block_ms in 1i64..20_000, max_wait_ms in 0i64..5_000,
        ) {
            let lim = limit(capacity, rate);
            let n = (capacity * share).max(1.0).min(capacity);
            let opts = TakeOptions::new(max_wait_ms, Some((block_ms, block_ms * 4)));
            let prior = state(tokens, NOW);
            let got = take_with(prior, None, &lim, n, &opts, NOW);
            prop_assume!(!got.allowed && got.retry_after_ms > 0);
            let wait = got.retry_after_ms;
            let retry = take_with(got.write, got.lock, &lim, n, &opts, NOW + wait);
            prop_assert!(retry.allowed, "allowed after {wait} ms");
            let early = take_with(got.write, got.lock, &lim, n, &TakeOptions { block: None, ..opts }, NOW + wait - 1);
            prop_assert!(!early.allowed, "not a ms sooner");
        }

        #[test]
        fn refund_keeps_tokens_within_capacity(
            capacity in finite_positive(), rate in finite_positive(),
            tokens in -1e6..1e7_f64, n in 0.0..1e7_f64, since_ms in -100_000i64..1_000_000,
        ) {
            let got = refund(state(tokens, NOW - since_ms), &limit(capacity, rate), n, NOW).outcome;
            if let Some(written) = got.write {
                prop_assert!(written.tokens >= tokens.min(0.0) && written.tokens <= capacity);
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
                prop_assert!(written.tokens.is_finite() && written.tokens >= tokens.min(0.0));
            }
        }
    }
}

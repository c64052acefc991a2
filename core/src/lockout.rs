//! Lockout after abuse (`BLOCK ms [MAXBLOCK ms]`), pure: when a lock
//! starts, how long it lasts, and when a new one escalates.
//!
//! A denied call that names `BLOCK` locks its key: until the lock ends every
//! take and peek on the key is denied, however many tokens it holds (they
//! keep refilling). A lock that starts before the previous one's probation
//! ends (probation: as long as that lock, counted from its end) lasts twice
//! as long, up to `MAXBLOCK`; so the k-th lock in a row lasts
//! `min(block_ms * 2^(k-1), max_block_ms)`. The lock lives in the bucket's
//! hash beside `tokens` (src/bucket/hash.rs stores it), and the key's TTL
//! covers the probation, so the strikes are forgotten exactly when the key
//! may go.

use crate::number::MAX_EXACT_INTEGER;

/// `BLOCK ms [MAXBLOCK ms]`, validated: both in [1, 2^53] ms and
/// `block_ms <= max_block_ms`. Without `MAXBLOCK` the two are equal, and
/// locks do not grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub block_ms: i64,
    pub max_block_ms: i64,
}

/// A lock as stored: the hash fields `locked_until`, `strikes` and
/// `probation_until`, all whole numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lock {
    /// Unix ms at which the lock ends; it holds while `now < until_ms`.
    pub until_ms: i64,
    /// Locks in this escalation, this one included; at least 1.
    pub strikes: i64,
    /// Unix ms until which a new lock escalates: the lock's end plus its
    /// length. Also the least the key's TTL must reach.
    pub probation_until_ms: i64,
}

impl Lock {
    /// A lock read from the hash, if its three fields make one: whole
    /// numbers in [0, 2^53], at least one strike, and a probation that does
    /// not end before the lock. `None` means the fields are damaged.
    pub fn from_fields(until_ms: i64, strikes: i64, probation_until_ms: i64) -> Option<Lock> {
        let in_range = |value: i64| (0..=MAX_EXACT_INTEGER).contains(&value);
        (in_range(until_ms)
            && in_range(strikes)
            && in_range(probation_until_ms)
            && strikes >= 1
            && probation_until_ms >= until_ms)
            .then_some(Lock {
                until_ms,
                strikes,
                probation_until_ms,
            })
    }

    /// Whether the lock still holds at `now_ms`.
    pub fn holds_at(&self, now_ms: i64) -> bool {
        now_ms < self.until_ms
    }

    /// The whole ms from `now_ms` until the lock ends (0 once it has).
    pub fn ms_left(&self, now_ms: i64) -> i64 {
        self.until_ms.saturating_sub(now_ms).max(0)
    }
}

/// How long the `strikes`-th lock in a row lasts:
/// `min(block_ms * 2^(strikes - 1), max_block_ms)`, without overflow.
pub fn lock_ms(block: &Block, strikes: i64) -> i64 {
    let doublings = strikes.saturating_sub(1).clamp(0, 62);
    // 2^62 fits an i64; past 53 doublings the product passes every
    // MAXBLOCK anyway, and saturating_mul keeps it at i64::MAX.
    let factor = 1i64.checked_shl(doublings as u32).unwrap_or(i64::MAX);
    block
        .block_ms
        .saturating_mul(factor)
        .min(block.max_block_ms)
        .max(1)
}

/// The lock a denial at `now_ms` starts, given the key's previous lock (if
/// any): the next strike if that lock's probation has not ended, else the
/// first again.
pub fn start(previous: Option<Lock>, block: &Block, now_ms: i64) -> Lock {
    let strikes = match previous {
        Some(lock) if now_ms < lock.probation_until_ms => {
            lock.strikes.saturating_add(1).min(MAX_EXACT_INTEGER)
        }
        _ => 1,
    };
    let length = lock_ms(block, strikes);
    let until_ms = now_ms.saturating_add(length).min(MAX_EXACT_INTEGER);
    Lock {
        until_ms,
        strikes,
        probation_until_ms: until_ms.saturating_add(length).min(MAX_EXACT_INTEGER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: i64 = 1_700_000_000_000;

    fn block(block_ms: i64, max_block_ms: i64) -> Block {
        Block {
            block_ms,
            max_block_ms,
        }
    }

    #[test]
    fn a_first_lock_lasts_block_ms_and_its_probation_as_long_again() {
        let lock = start(None, &block(1000, 8000), NOW);
        assert_eq!(
            lock,
            Lock {
                until_ms: NOW + 1000,
                strikes: 1,
                probation_until_ms: NOW + 2000
            }
        );
        assert!(lock.holds_at(NOW + 999) && !lock.holds_at(NOW + 1000));
        assert_eq!(lock.ms_left(NOW + 250), 750);
    }

    #[test]
    fn a_lock_within_probation_doubles_up_to_max_block() {
        let limits = block(1000, 5000);
        let mut now = NOW;
        let mut lock = start(None, &limits, now);
        let mut lengths = vec![lock.until_ms - now];
        for _ in 0..4 {
            now = lock.until_ms; // denied again the moment it ends
            lock = start(Some(lock), &limits, now);
            lengths.push(lock.until_ms - now);
        }
        assert_eq!(lengths, [1000, 2000, 4000, 5000, 5000]);
        assert_eq!(lock.strikes, 5);
    }

    #[test]
    fn a_lock_after_probation_starts_over() {
        let limits = block(1000, 64_000);
        let first = start(None, &limits, NOW);
        let second = start(Some(first), &limits, first.probation_until_ms - 1);
        assert_eq!(second.strikes, 2);
        let fresh = start(Some(second), &limits, second.probation_until_ms);
        assert_eq!(
            (fresh.strikes, fresh.until_ms - second.probation_until_ms),
            (1, 1000)
        );
    }

    #[test]
    fn without_max_block_locks_never_grow() {
        let limits = block(300, 300);
        assert_eq!(lock_ms(&limits, 1), 300);
        assert_eq!(lock_ms(&limits, 40), 300);
    }

    #[test]
    fn huge_strike_counts_and_lengths_saturate() {
        let limits = block(MAX_EXACT_INTEGER, MAX_EXACT_INTEGER);
        assert_eq!(lock_ms(&limits, i64::MAX), MAX_EXACT_INTEGER);
        let lock = start(None, &limits, MAX_EXACT_INTEGER);
        assert_eq!(lock.until_ms, MAX_EXACT_INTEGER);
        assert_eq!(lock.probation_until_ms, MAX_EXACT_INTEGER);
    }

    #[test]
    fn damaged_lock_fields_are_refused() {
        assert!(Lock::from_fields(NOW, 1, NOW).is_some());
        assert_eq!(Lock::from_fields(NOW, 0, NOW), None);
        assert_eq!(Lock::from_fields(-1, 1, NOW), None);
        assert_eq!(Lock::from_fields(NOW, 1, NOW - 1), None);
        assert_eq!(Lock::from_fields(NOW, 1, MAX_EXACT_INTEGER + 1), None);
    }

    proptest! {
        /// Against the rule as the issue states it: the k-th lock of an
        /// escalation lasts min(ms * 2^(k-1), MAXBLOCK).
        #[test]
        fn the_kth_escalating_lock_lasts_ms_times_2_pow_k_minus_1_capped(
            block_ms in 1i64..100_000,
            extra in 0i64..10_000_000,
            gaps in proptest::collection::vec(0i64..3, 1..30),
        ) {
            let limits = block(block_ms, block_ms + extra);
            let mut now = NOW;
            let mut previous: Option<Lock> = None;
            let mut expected_strike: i64 = 0;
            for gap in gaps {
                // gap 0: at the lock's end; 1: inside the probation; 2: after it.
                if let Some(lock) = previous {
                    now = match gap {
                        0 => lock.until_ms,
                        1 => lock.probation_until_ms - 1,
                        _ => lock.probation_until_ms,
                    };
                    expected_strike = if gap < 2 { expected_strike + 1 } else { 1 };
                } else {
                    expected_strike = 1;
                }
                let lock = start(previous, &limits, now);
                let model = (block_ms as i128 * (1i128 << (expected_strike - 1).min(70)))
                    .min(i128::from(block_ms + extra)) as i64;
                prop_assert_eq!(lock.strikes, expected_strike);
                prop_assert_eq!(lock.until_ms - now, model);
                prop_assert_eq!(lock.probation_until_ms - lock.until_ms, model);
                previous = Some(lock);
            }
        }
    }
}

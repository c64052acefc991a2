//! What the two simulated servers of the machine's property tests share
//! (`token_tests.rs` for TB.BTAKE, `lease_tests.rs` for TB.ACQUIRE): the callback
//! orders and the server's timers, with the checks every timer must pass.

use std::collections::BTreeMap;

use super::{Db, Timer, TimerId, WaiterId, MAX_TIMER_MS};

/// When the server runs a blocked client's callback after an unblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Inside `RM_UnblockClient` (Redis 7.0 and 7.2, Valkey).
    Sync,
    /// Before the event loop sleeps, after the timers due in this pass
    /// (Redis 7.4+).
    Deferred,
}

pub type Key = (Db, Vec<u8>);

#[derive(Clone, Debug, PartialEq)]
pub enum TimerFor {
    Wake(Key, u64),
    Deadline(WaiterId),
}

/// The server's armed timers on the virtual clock.
#[derive(Debug, Default)]
pub struct Timers {
    /// Each timer's due time and what it is for.
    pub armed: BTreeMap<TimerId, (i64, TimerFor)>,
    last: TimerId,
    /// Timers due in the same ms fire in either order on a real server
    /// (they are due in µs): newest first when set.
    pub newest_first: bool,
}

impl Timers {
    /// Arms `timer` at `now_ms + delay_ms`; a second wake-up for one key or
    /// a delay out of range is a violation.
    pub fn arm(
        &mut self,
        timer: Timer<'_>,
        now_ms: i64,
        delay_ms: i64,
        violations: &mut Vec<String>,
    ) -> TimerId {
        self.last += 1;
        let what = match timer {
            Timer::Wake { db, key, token } => {
                let key = (db, key.to_vec());
                if self
                    .armed
                    .values()
                    .any(|(_, what)| matches!(what, TimerFor::Wake(k, _) if *k == key))
                {
                    violations.push(format!("a second wake-up for {key:?}"));
                }
                TimerFor::Wake(key, token)
            }
            Timer::Deadline(id) => TimerFor::Deadline(id),
        };
        if !(0..=MAX_TIMER_MS).contains(&delay_ms) {
            violations.push(format!("timer of {delay_ms} ms"));
        }
        self.armed.insert(self.last, (now_ms + delay_ms, what));
        self.last
    }

    /// Cancels a timer the machine armed, of the kind it says (`wake`).
    pub fn cancel(&mut self, timer: TimerId, wake: bool, violations: &mut Vec<String>) {
        match self.armed.remove(&timer) {
            Some((_, TimerFor::Wake(..))) if wake => {}
            Some((_, TimerFor::Deadline(_))) if !wake => {}
            other => violations.push(format!("cancel of {timer} (wake {wake}): {other:?}")),
        }
    }

    /// The next timer due by `now_ms`, taken out: the earliest, and among
    /// those due in one ms the oldest (or the newest, see `newest_first`).
    pub fn take_due(&mut self, now_ms: i64) -> Option<TimerFor> {
        let newest_first = self.newest_first;
        let (timer, _) = self
            .armed
            .iter()
            .filter(|(_, (at, _))| *at <= now_ms)
            .min_by_key(|(id, (at, _))| (*at, if newest_first { u64::MAX - **id } else { **id }))?;
        let timer = *timer;
        self.armed.remove(&timer).map(|(_, what)| what)
    }

    /// When the next timer after `now_ms` is due.
    pub fn next_after(&self, now_ms: i64) -> Option<i64> {
        self.armed
            .values()
            .map(|(at, _)| *at)
            .filter(|at| *at > now_ms)
            .min()
    }

    /// How many wake-up and deadline timers are armed.
    pub fn counts(&self) -> (usize, usize) {
        let wakes = self
            .armed
            .values()
            .filter(|(_, what)| matches!(what, TimerFor::Wake(..)))
            .count();
        (wakes, self.armed.len() - wakes)
    }

    pub fn is_empty(&self) -> bool {
        self.armed.is_empty()
    }
}

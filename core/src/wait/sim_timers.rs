//! The simulated server of the machine's property tests, one for both
//! kinds (`token_tests.rs` for TB.BTAKE, `lease_tests.rs` for TB.ACQUIRE):
//! the callback orders, the clock, the pause and the timers, with the
//! checks every timer and every write must pass. Each test file adds only
//! its kind's keyspace (a [`Keyspace`]) and its reference model.

use std::collections::BTreeMap;

use super::{Db, Kind, Server, Timer, TimerId, WaiterId, Writable, MAX_TIMER_MS};
use crate::error::TbError;

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

/// The server: its clock, its pause and its timers, what it saw go wrong,
/// and the keys of the kind under test.
#[derive(Debug, Default)]
pub struct Sim<S> {
    pub now_ms: i64,
    /// Writes are paused (CLIENT PAUSE WRITE, a failover).
    pub paused: bool,
    pub timers: Timers,
    /// Every broken rule seen so far; a run fails on the first.
    pub violations: Vec<String>,
    pub keyspace: S,
}

/// How a kind's keys are read and stored on the simulated server; the
/// checks every write must pass are made before [`Keyspace::write`].
pub trait Keyspace<K: Kind>: Sized {
    fn read(sim: &mut Sim<Self>, db: Db, key: &[u8], now_ms: i64) -> Result<K::State, TbError>;
    fn write(
        sim: &mut Sim<Self>,
        db: Db,
        key: &[u8],
        state: &K::State,
        now_ms: i64,
    ) -> Result<(), TbError>;
}

impl<S: Default> Sim<S> {
    /// An empty server whose clock reads `now_ms`.
    pub fn starting_at(now_ms: i64) -> Sim<S> {
        Sim {
            now_ms,
            ..Sim::default()
        }
    }
}

impl<S> Sim<S> {
    /// A read or write by the machine must use the server's clock of this
    /// event (`what`: "read" or "write").
    pub fn check_clock(&mut self, what: &str, now_ms: i64) {
        if now_ms != self.now_ms {
            self.violations.push(format!("{what} with a stale clock"));
        }
    }

    /// What every write must pass: writes are not paused, and the clock is
    /// the server's.
    pub fn check_write(&mut self, key: &[u8], now_ms: i64) {
        if self.paused {
            self.violations
                .push(format!("write of {key:?} while paused"));
        }
        self.check_clock("write", now_ms);
    }
}

impl<K: Kind, S: Keyspace<K>> Server<K> for Sim<S> {
    fn read(&mut self, db: Db, key: &[u8], now_ms: i64) -> Result<K::State, TbError> {
        S::read(self, db, key, now_ms)
    }

    fn write(&mut self, db: Db, key: &[u8], state: &K::State, now_ms: i64) -> Result<(), TbError> {
        self.check_write(key, now_ms);
        S::write(self, db, key, state, now_ms)
    }

    fn writable(&mut self, _db: Db, _key: &[u8]) -> Writable {
        if self.paused {
            Writable::Paused
        } else {
            Writable::Yes
        }
    }

    fn arm(&mut self, timer: Timer<'_>, delay_ms: i64) -> TimerId {
        self.timers
            .arm(timer, self.now_ms, delay_ms, &mut self.violations)
    }

    fn cancel(&mut self, timer: TimerId, wake: bool) {
        self.timers.cancel(timer, wake, &mut self.violations);
    }
}

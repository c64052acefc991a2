//! Fault injection for the tests of failed writes.
//!
//! The server refuses a bucket write only in states the module checks for
//! beforehand (a wrong type, a key not open for writing), so the failure
//! path cannot be reached from outside. Built with the cargo feature
//! `fault-injection` (only `make test` does that, into its own target
//! directory), the load argument `fault hash-set|expire EVERY` makes every
//! EVERY-th attempt at that step fail as the server would, so the tests can
//! check that a failed write replies an error, propagates nothing and
//! leaves the key as it was. `fault-skip-rollback yes` also makes `write_all`
//! leave in place the writes a refused TB.TAKEALL had already applied, so
//! the tests can show that their rollback checks fail without the rollback
//! (they would pass vacuously if the fault never reached it). Without the
//! feature `injected` and `rollback_skipped` are a constant `false` and the
//! load arguments do not exist. load.rs hands them here before config.rs
//! reads the others (`arm_from_load_args`).

/// A step of a bucket write that can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    HashSet,
    Expire,
}

#[cfg(feature = "fault-injection")]
mod enabled {
    use super::Step;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};

    /// 0: none, 1: HashSet, 2: Expire.
    static STEP: AtomicU8 = AtomicU8::new(0);
    static EVERY: AtomicU64 = AtomicU64::new(0);
    static SEEN: AtomicU64 = AtomicU64::new(0);
    static SKIP_ROLLBACK: AtomicBool = AtomicBool::new(false);

    fn code(step: Step) -> u8 {
        match step {
            Step::HashSet => 1,
            Step::Expire => 2,
        }
    }

    /// Parses `hash-set|expire EVERY` and arms the fault.
    fn arm(step: &[u8], every: &[u8]) -> Result<(), String> {
        let step = match step {
            b"hash-set" => Step::HashSet,
            b"expire" => Step::Expire,
            _ => return Err("fault must be followed by hash-set or expire".into()),
        };
        let every: u64 = std::str::from_utf8(every)
            .ok()
            .and_then(|text| text.parse().ok())
            .filter(|every| *every > 0)
            .ok_or("fault STEP must be followed by a count > 0")?;
        STEP.store(code(step), Relaxed);
        EVERY.store(every, Relaxed);
        SEEN.store(0, Relaxed);
        Ok(())
    }

    pub fn injected(step: Step) -> bool {
        if STEP.load(Relaxed) != code(step) {
            return false;
        }
        let seen = SEEN.load(Relaxed).wrapping_add(1);
        SEEN.store(seen, Relaxed);
        seen.checked_rem(EVERY.load(Relaxed)) == Some(0)
    }

    /// Parses the `yes|no` of `fault-skip-rollback`.
    fn arm_skip_rollback(value: &[u8]) -> Result<(), String> {
        let skip = match value {
            b"yes" => true,
            b"no" => false,
            _ => return Err("fault-skip-rollback must be followed by yes or no".into()),
        };
        SKIP_ROLLBACK.store(skip, Relaxed);
        Ok(())
    }

    pub fn rollback_skipped() -> bool {
        SKIP_ROLLBACK.load(Relaxed)
    }

    /// Arms what the load arguments `fault STEP EVERY` and
    /// `fault-skip-rollback yes|no` ask for, and returns the other
    /// arguments, in order, for config.rs to check. Those are `name value`
    /// pairs, taken two at a time here too, so a `fault` in a value's place
    /// stays that value (and is refused there).
    pub fn arm_from_load_args<'a>(args: &[&'a [u8]]) -> Result<Vec<&'a [u8]>, String> {
        let mut others = Vec::with_capacity(args.len());
        let mut rest = args.iter().copied();
        while let Some(name) = rest.next() {
            match name {
                b"fault" => {
                    let step = rest.next().unwrap_or_default();
                    arm(step, rest.next().unwrap_or_default())?;
                }
                b"fault-skip-rollback" => arm_skip_rollback(rest.next().unwrap_or_default())?,
                _ => {
                    others.push(name);
                    others.extend(rest.next());
                }
            }
        }
        Ok(others)
    }
}

#[cfg(feature = "fault-injection")]
pub use enabled::{arm_from_load_args, injected, rollback_skipped};

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn injected(_step: Step) -> bool {
    false
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn rollback_skipped() -> bool {
    false
}

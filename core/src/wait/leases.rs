//! Lease wait, TB.ACQUIRE's kind of wait, as pure rules: a waiter asks for
//! one lease of a lease set (`lease.rs`); a wake-up serves it on the set as
//! read; this is what it is told. How the set is read and written, and the
//! reply sent, is the module's (src/lease/commands.rs).

use crate::error::TbError;
use crate::lease::{self, Acquire, Grant, LeaseId, LeaseLimit, SetView};
use crate::wait::{self, Kind, Unserved};

/// What TB.ACQUIRE answers: `[acquired, available, retry_after_ms, lease]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseReply {
    pub id: Option<LeaseId>,
    pub available: i64,
    pub retry_after_ms: i64,
}

/// TB.ACQUIRE's kind of wait: one lease of a lease set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Leases;

/// The lease set as a wake-up serves it: as read, then with the leases
/// granted so far, which the write stores in one ZADD.
pub struct LeasesServed {
    pub seen: SetView,
    pub grants: Vec<Grant>,
}

#[cfg(test)]
impl LeasesServed {
    /// A lease set as a server read it, nothing granted yet (the tests'
    /// simulated server).
    pub(crate) fn read_as(seen: SetView) -> LeasesServed {
        LeasesServed {
            seen,
            grants: Vec::new(),
        }
    }

    /// The leases granted so far, in order, which the write stores.
    pub(crate) fn grants(&self) -> &[Grant] {
        &self.grants
    }
}

impl Kind for Leases {
    type Request = LeaseLimit;
    type State = LeasesServed;
    type Grant = Grant;
    type Reply = LeaseReply;

    fn weight(_request: &LeaseLimit) -> f64 {
        1.0
    }

    fn serve(
        state: &mut LeasesServed,
        request: &LeaseLimit,
        now_ms: i64,
    ) -> Result<(Grant, bool), Unserved> {
        match lease::acquire(&state.seen, request, 0, now_ms) {
            Ok(Acquire::Granted(grant)) => {
                state.seen = lease::after_grant(&state.seen, &grant);
                state.grants.push(grant);
                Ok((grant, true))
            }
            // A slot frees up when the earliest live lease ends (or sooner,
            // at a release, which wakes the queue by itself).
            Ok(Acquire::Denied { retry_after_ms, .. }) => {
                Err(Unserved::Later(retry_after_ms.max(1)))
            }
            Err(error) => Err(Unserved::Failed(error)),
        }
    }

    fn granted(grant: Grant) -> LeaseReply {
        LeaseReply {
            id: Some(grant.id),
            available: grant.available,
            retry_after_ms: 0,
        }
    }

    fn denied(
        state: &LeasesServed,
        request: &LeaseLimit,
        queued: f64,
        now_ms: i64,
    ) -> Result<LeaseReply, TbError> {
        // `queued` counts whole waiters (weight 1 each).
        let waiting = queued.max(0.0).min(i64::MAX as f64) as i64;
        let (available, retry_after_ms) = match lease::denial(&state.seen, request, waiting, now_ms)
        {
            Acquire::Denied {
                available,
                retry_after_ms,
            } => (available, retry_after_ms),
            Acquire::Granted(_) => (0, 0),
        };
        Ok(LeaseReply {
            id: None,
            available,
            retry_after_ms,
        })
    }

    /// No slot available, and a retry as soon as the machine itself would
    /// look at a migrating key again.
    fn denied_elsewhere(_: &LeaseLimit, _: i64) -> LeaseReply {
        LeaseReply {
            id: None,
            available: 0,
            retry_after_ms: wait::MIGRATING_RECHECK_MS,
        }
    }
}

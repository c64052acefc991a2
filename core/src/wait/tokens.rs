//! The two kinds of wait of the waiting machine (`wait.rs`), as pure rules:
//! what a waiter asks for, how a wake-up serves it on the key's value as
//! read, and what it is told. [`Tokens`] is TB.BTAKE's (`n` tokens of a
//! bucket, `bucket.rs`), [`Leases`] TB.ACQUIRE's (one lease of a lease set,
//! `lease.rs`). How each reads and writes its key, replies and counts is its
//! command's glue (`btake.rs`, `lease_commands.rs`, `wait_glue::GlueKind`).

use crate::args::Request;
use crate::bucket::{self, Outcome, State};
use crate::error::TbError;
use crate::lease::{self, Acquire, Grant, LeaseId, LeaseLimit, Seen};
use crate::wait::{self, Kind, MainThread, Unserved};

// --- Tokens -----------------------------------------------------------------

/// TB.BTAKE's kind of wait: `n` tokens of a bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tokens;

/// The bucket as a wake-up serves it: as read (`None`: missing, a full
/// bucket), then as left by the heads served so far, with the expiry the
/// write sets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Served {
    pub bucket: Option<State>,
    pub expire_at_ms: i64,
}

/// What a served TB.BTAKE replies besides `allowed`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenGrant {
    pub remaining: i64,
    pub reset_after_ms: i64,
}

/// TB.BTAKE's machine.
pub type TokenMachine = wait::Machine<Tokens>;

static TOKEN_MACHINE: MainThread<Tokens> = MainThread::new();

impl Kind for Tokens {
    type Request = Request;
    type State = Served;
    type Grant = TokenGrant;
    type Reply = Outcome;

    fn machine() -> &'static MainThread<Tokens> {
        &TOKEN_MACHINE
    }

    fn weight(request: &Request) -> f64 {
        request.n
    }

    fn serve(
        state: &mut Served,
        request: &Request,
        now_ms: i64,
    ) -> Result<(TokenGrant, bool), Unserved> {
        let outcome = bucket::take(state.bucket, &request.limit, request.n, now_ms);
        if !outcome.allowed {
            return Err(Unserved::Later(outcome.retry_after_ms));
        }
        let wrote = match outcome.write {
            Some(after) => {
                state.bucket = Some(after);
                state.expire_at_ms = bucket::expire_at_ms(now_ms, outcome.reset_after_ms);
                true
            }
            None => false,
        };
        let grant = TokenGrant {
            remaining: outcome.remaining,
            reset_after_ms: outcome.reset_after_ms,
        };
        Ok((grant, wrote))
    }

    fn granted(grant: TokenGrant) -> Outcome {
        Outcome {
            allowed: true,
            remaining: grant.remaining,
            retry_after_ms: 0,
            reset_after_ms: grant.reset_after_ms,
            write: None,
        }
    }

    fn denied(
        state: &Served,
        request: &Request,
        queued: f64,
        now_ms: i64,
    ) -> Result<Outcome, TbError> {
        let denial = bucket::take_behind(state.bucket, &request.limit, request.n, queued, now_ms);
        Ok(denial)
    }

    /// The figures of a bucket emptied at `now_ms`: none left, n tokens'
    /// refill to wait, a full refill to reset.
    fn denied_elsewhere(request: &Request, now_ms: i64) -> Outcome {
        let empty = State {
            tokens: 0.0,
            last_refill_ms: now_ms as f64,
        };
        bucket::take_behind(Some(empty), &request.limit, request.n, 0.0, now_ms)
    }
}

// --- Leases -----------------------------------------------------------------

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
    pub seen: Seen,
    pub grants: Vec<Grant>,
}

#[cfg(test)]
impl LeasesServed {
    /// A lease set as a server read it, nothing granted yet (the tests'
    /// simulated server).
    pub(crate) fn read_as(seen: Seen) -> LeasesServed {
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

static LEASE_MACHINE: MainThread<Leases> = MainThread::new();

impl Kind for Leases {
    type Request = LeaseLimit;
    type State = LeasesServed;
    type Grant = Grant;
    type Reply = LeaseReply;

    fn machine() -> &'static MainThread<Leases> {
        &LEASE_MACHINE
    }

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

//! What the blocking and the async limiter share: their settings
//! ([`Options`]) and the pure part of their calls, so that only the I/O
//! differs between `sync` and `aio`.

use crate::backend::{Call, Logger, Op, Timeouts};
use crate::core::MODULE_RECHECK;
use crate::error::Result;
use crate::lease::{self, AcquireCall, LeaseDecision};
use std::time::Duration;

/// Settings shared by both limiters.
#[derive(Clone)]
pub(crate) struct Options {
    pub logger: Option<Logger>,
    pub timeouts: Timeouts,
    pub policy_name: String,
    pub recheck: Duration,
    /// Leases: an unavailable limiter gives a failed-open `LeaseDecision`
    /// (plain calls) or `Permit::FailedOpen` (guards).
    pub lease_fail_open: bool,
    /// The longest sleep of a polling `wait_acquire` (`poll_ms`).
    pub lease_poll: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            logger: None,
            timeouts: Timeouts::default(),
            policy_name: "default".into(),
            recheck: MODULE_RECHECK,
            lease_fail_open: false,
            lease_poll: lease::LEASE_POLL_DEFAULT,
        }
    }
}

/// The calls both limiters build, from their settings alone: the pure part
/// of each limiter method, so that only the I/O differs between sync and async.
impl Options {
    /// A one-bucket call (`take`, `peek`, `refund`, `wait_take`) under the
    /// limiter's policy name.
    pub fn single(
        &self,
        op: Op,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Call> {
        let (capacity, rate, n) = (capacity.into(), rate.into(), n.into());
        Call::single(op, key, capacity, rate, n, &self.policy_name)
    }

    /// An acquire under the limiter's policy name and polling cap.
    pub fn acquire_call(&self, key: &str, limit: u64, lease_ms: u64) -> Result<AcquireCall> {
        Ok(AcquireCall::new(key, limit, lease_ms, &self.policy_name)?.poll(self.lease_poll))
    }

    /// An acquire's `outcome`, an outage turned into a failed-open decision
    /// when leases fail open.
    pub fn lease_fail_open(
        &self,
        call: &AcquireCall,
        outcome: Result<LeaseDecision>,
    ) -> Result<LeaseDecision> {
        match outcome {
            Err(e) if self.lease_fail_open && e.is_unavailable() => {
                Ok(LeaseDecision::failed_open(call))
            }
            other => other,
        }
    }
}

/// How long the reply of a wait in the server (TB.BTAKE, TB.ACQUIRE with a
/// timeout) may take: its own `timeout_ms` plus a margin; `None` for a wait
/// without a limit (0).
pub(crate) fn wait_read_bound(timeouts: &Timeouts, timeout_ms: u64) -> Option<Duration> {
    let margin = timeouts.command + Duration::from_secs(1);
    (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms) + margin)
}

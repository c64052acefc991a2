//! Token wait, TB.BTAKE's kind of wait, as pure rules: a waiter asks for
//! `n` tokens of a bucket (`bucket.rs`); a wake-up serves it on the bucket
//! as read; this is what it is told. How the bucket is read and written,
//! and the reply sent, is the module's (src/bucket/btake.rs).

use crate::args::Request;
use crate::bucket::{self, Outcome, State};
use crate::error::TbError;
use crate::wait::{self, Kind, Unserved};

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

impl Kind for Tokens {
    type Request = Request;
    type State = Served;
    type Grant = TokenGrant;
    type Reply = Outcome;

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
            lock: None,
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

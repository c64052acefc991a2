//! TB.BTAKE key capacity rate n timeout_ms: wait in the server, first come
//! first served, until the bucket holds n.
//!
//! The command itself, and [`Tokens`], the kind of wait it is: what a
//! waiter asks for (a limit and n), how a wake-up serves it on the bucket
//! (`wait::Kind`), and how the bucket is read and written, the reply sent
//! and the waits counted (`wait_glue::GlueKind`). The waiting itself is the
//! state machine in `wait.rs`; blocking the client and every server
//! callback are in `wait_glue.rs`, shared with TB.ACQUIRE.

use std::os::raw::c_int;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::api::Api;
use crate::args::{parse_request, parse_timeout, Request};
use crate::bucket::{self, Outcome, State};
use crate::commands::{count_decision, run, send, shadow, Reply, Single};
use crate::error::TbError;
use crate::metrics;
use crate::store::{store, Access, BucketKey};
use crate::wait::{self, Kind, MainThread, Unserved};
use crate::wait_glue::{self, GlueKind};

/// TB.BTAKE key capacity rate n timeout_ms
///
/// Exactly TB.TAKE when it can be granted at once (or may not wait: inside
/// MULTI, a script, or where the server forbids blocking; or in shadow
/// mode); otherwise the client waits behind those already waiting on the
/// key.
fn btake(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let [_, key, capacity, rate, n, timeout] = args else {
        return Err(TbError::WrongArity);
    };
    let key = *key;
    // Arguments in order, before any key is touched.
    // SAFETY: argv strings live for the whole command.
    let request =
        unsafe { parse_request(api.bytes(capacity), api.bytes(rate), Some(api.bytes(n))) }?;
    let timeout_ms = parse_timeout(unsafe { api.bytes(timeout) })?;
    let single = Single::open_request(api, ctx, key, request, Access::Write)?;
    let outcome = single.charge.judge(single.now_ms);
    // `retry_after_ms = -1`: n exceeds the capacity and can never be granted.
    let would_wait = !outcome.allowed && outcome.retry_after_ms > 0;
    if !would_wait || !wait_glue::may_block(api, ctx) || crate::commands::SHADOW_MODE.load(Relaxed)
    {
        store(&[(&single.bucket, &outcome)], single.now_ms)?;
        count_decision(outcome.allowed, request.n);
        return Ok(Reply::Decision(shadow(outcome)));
    }
    // SAFETY: a live context and argument.
    let (db, name) = unsafe { ((api.selected_db)(ctx), api.bytes(&key)) };
    wait_glue::room::<Tokens>(db, name)?;
    // A denial writes nothing but a clock repair, stored before the wait.
    store(&[(&single.bucket, &outcome)], single.now_ms)?;
    drop(single);

    wait_glue::block::<Tokens>(
        api,
        ctx,
        key,
        (db, name),
        request,
        timeout_ms,
        outcome.retry_after_ms,
    )?;
    Ok(Reply::Blocked)
}

pub extern "C" fn tb_btake(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, btake)
}

// --- The kind: tokens -------------------------------------------------------

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

static MACHINE: MainThread<Tokens> = MainThread::new();

impl Kind for Tokens {
    type Request = Request;
    type State = Served;
    type Grant = TokenGrant;
    type Reply = Outcome;

    fn machine() -> &'static MainThread<Tokens> {
        &MACHINE
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
}

impl GlueKind for Tokens {
    fn read(
        api: &Api,
        ctx: *mut RedisModuleCtx,
        key: *mut RedisModuleString,
        _now_ms: i64,
    ) -> Result<Served, TbError> {
        // SAFETY: a live context and key string.
        let mut bucket = unsafe { BucketKey::open(api, ctx, key, Access::Read) }
            .map_err(|_| TbError::BucketGone)?;
        let bucket = bucket.read().map_err(|_| TbError::BucketGone)?;
        Ok(Served {
            bucket,
            expire_at_ms: 0,
        })
    }

    fn write(
        api: &Api,
        ctx: *mut RedisModuleCtx,
        key: *mut RedisModuleString,
        state: &Served,
        now_ms: i64,
    ) -> Result<(), TbError> {
        // A write follows a take, which leaves a bucket.
        let Some(after) = state.bucket else {
            return Err(TbError::Internal);
        };
        // SAFETY: a live context and key string.
        let mut bucket = unsafe { BucketKey::open(api, ctx, key, Access::Write) }
            .map_err(|_| TbError::BucketGone)?;
        bucket.read().map_err(|_| TbError::BucketGone)?;
        bucket.write(&after, now_ms, state.expire_at_ms)
    }

    fn exists(api: &Api, ctx: *mut RedisModuleCtx, key: *mut RedisModuleString) -> bool {
        // SAFETY: a live context and key string.
        unsafe { BucketKey::open(api, ctx, key, Access::Read) }.is_ok_and(|bucket| bucket.exists())
    }

    fn reply(
        api: &Api,
        ctx: *mut RedisModuleCtx,
        result: Result<Outcome, TbError>,
        request: &Request,
        waited_ms: i64,
    ) {
        match result {
            Ok(outcome) if outcome.allowed => metrics::WAITS_SERVED.bump(),
            Ok(_) => metrics::WAITS_TIMED_OUT.bump(),
            Err(_) => {}
        }
        if let Ok(outcome) = result {
            count_decision(outcome.allowed, request.n);
        }
        metrics::WAIT_MS.add(waited_ms as f64);
        send(api, ctx, &[], result.map(Reply::Decision));
    }

    fn waiting(count: usize) {
        metrics::WAITING.set(u64::try_from(count).unwrap_or(u64::MAX));
    }
}

//! The TB commands: one handler per command, the reply they send, and the
//! shadow-mode policy. Each handler reads the clock once, judges with the
//! pure arithmetic of `bucket.rs`, stores through `store.rs` and replies;
//! TB.BTAKE's waiting lives in `btake.rs`.

use std::collections::HashSet;
use std::os::raw::{c_int, c_long};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::api::{self, Api};
use crate::args::{self, parse_request};
use crate::bucket::{self, Charge, Outcome};
use crate::error::{corrupt_bucket_message, corrupt_lease_set_message, TbError};
use crate::kinds::{LeaseReply, TokenMachine};
use crate::metrics;
use crate::store::{store, Access, BucketKey, Corrupt};
use crate::wait;

/// `tb.shadow-mode`: report denials as allowed (see `shadow`).
pub static SHADOW_MODE: AtomicBool = AtomicBool::new(false);

/// What a command answers: TB.TAKE's four integers
/// `[allowed, remaining, retry_after_ms, reset_after_ms]`; for TB.TAKEALL a
/// fifth, the index of the bucket those figures belong to; or nothing yet,
/// when TB.BTAKE has blocked the client (`btake.rs` answers it later).
pub enum Reply {
    Decision(Outcome),
    All {
        outcome: Outcome,
        index: usize,
    },
    /// TB.ACQUIRE: `[acquired, available, retry_after_ms, lease]`.
    Lease(LeaseReply),
    /// TB.RELEASE, TB.RENEW: 1 or 0.
    Flag(bool),
    Blocked,
}

/// The argument index of the key in TB.TAKE, TB.PEEK and TB.REFUND.
pub const KEY_ARG: usize = 1;

/// TB.TAKE key capacity rate n
///
/// Refill by elapsed time, cap at capacity, take n if there are that many
/// (and no TB.BTAKE caller waits on the bucket: see `bucket::take_behind`).
fn take(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let single = Single::open(api, ctx, args, Access::Write)?;
    let outcome = single.charge.judge(single.now_ms);
    store(&[(&single.bucket, &outcome)], single.now_ms)?;
    count_decision(outcome.allowed, single.charge.n);
    Ok(Reply::Decision(shadow(outcome)))
}

/// TB.PEEK key capacity rate [n]
///
/// The reply TB.TAKE would give, without taking or writing anything, so it
/// is read-only and runs on replicas. A `last_refill` in the future is
/// answered as if repaired, though only a write command stores the repair.
fn peek(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let single = Single::open(api, ctx, args, Access::Read)?;
    Ok(Reply::Decision(single.charge.judge(single.now_ms)))
}

/// TB.REFUND key capacity rate n
///
/// Gives n tokens back (refill first, then add, capped at capacity), for a
/// request that failed for the caller's own reasons. Its write wakes the
/// TB.BTAKE queue of the bucket, if it has one (`btake.rs` listens to the
/// key's events).
fn refund(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let single = Single::open(api, ctx, args, Access::Write)?;
    let charge = &single.charge;
    let refunded = bucket::refund(charge.state, &charge.limit, charge.n, single.now_ms);
    store(&[(&single.bucket, &refunded.outcome)], single.now_ms)?;
    metrics::TOKENS_REFUNDED.add(refunded.added);
    Ok(Reply::Decision(refunded.outcome))
}

/// One bucket named by `key capacity rate n` (n optional for reads, as in
/// TB.PEEK), parsed, opened, read, and the instant it is judged at.
pub struct Single<'a> {
    pub bucket: BucketKey<'a>,
    pub charge: Charge,
    pub now_ms: i64,
}

impl<'a> Single<'a> {
    fn open(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        args: &[*mut RedisModuleString],
        access: Access,
    ) -> Result<Self, TbError> {
        match (args, access) {
            (&[_, key, capacity, rate, n], _) => {
                Single::open_parts(api, ctx, key, [capacity, rate], Some(n), access)
            }
            (&[_, key, capacity, rate], Access::Read) => {
                Single::open_parts(api, ctx, key, [capacity, rate], None, access)
            }
            _ => Err(TbError::WrongArity),
        }
    }

    /// `key`, `[capacity, rate]` and `n` as the command's arguments.
    pub fn open_parts(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        key: *mut RedisModuleString,
        [capacity, rate]: [*mut RedisModuleString; 2],
        n: Option<*mut RedisModuleString>,
        access: Access,
    ) -> Result<Self, TbError> {
        // SAFETY: argv strings live for the whole command.
        let request = unsafe {
            parse_request(
                api.bytes(&capacity),
                api.bytes(&rate),
                n.as_ref().map(|n| api.bytes(n)),
            )
        }?;
        Single::open_request(api, ctx, key, request, access)
    }

    /// `key` with a request already parsed.
    pub fn open_request(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        key: *mut RedisModuleString,
        request: args::Request,
        access: Access,
    ) -> Result<Self, TbError> {
        // SAFETY: ctx and key come straight from the server for this command.
        let mut bucket = unsafe { BucketKey::open(api, ctx, key, access) }?;
        let state = read(&mut bucket, KEY_ARG)?;
        // The clock is read once; the refill, the reply and the deadline all
        // use this instant.
        Ok(Single {
            bucket,
            charge: Charge {
                state,
                limit: request.limit,
                n: request.n,
                behind: queued_on(api, ctx, key),
            },
            now_ms: now(api),
        })
    }
}

/// The tokens TB.BTAKE callers waiting on `key` want, if any wait: the
/// commands leave those tokens to the queue (`bucket::take_behind`).
fn queued_on(api: &Api, ctx: *mut RedisModuleCtx, key: *mut RedisModuleString) -> Option<f64> {
    wait::with_machine(|machine: &mut TokenMachine| {
        if machine.is_empty() {
            return None; // the usual case: no lookup at all
        }
        // SAFETY: a live context and argument.
        let (db, name) = unsafe { ((api.selected_db)(ctx), api.bytes(&key)) };
        machine.queued(db, name)
    })
    .flatten()
}

/// TB.TAKEALL key capacity rate n [key capacity rate n ...]
///
/// Several limits on one request, all or nothing. Every argument is parsed,
/// and every key type-checked and read, before anything is written, so an
/// error or a denial leaves every bucket as it was (bar clock repairs, see
/// `bucket::seen_at`). The server runs the whole command at once, so no
/// client sees some buckets charged and others not; the replicated
/// HSET/PEXPIREAT pairs arrive in one MULTI/EXEC.
fn take_all(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let groups = args.get(1..).unwrap_or_default();
    if groups.is_empty() || groups.len() % 4 != 0 {
        return Err(TbError::WrongArity);
    }
    let count = groups.len() / 4;
    let mut keys = Vec::with_capacity(count);
    let mut requests = Vec::with_capacity(count);
    for group in groups.chunks_exact(4) {
        let [key, capacity, rate, n] = group else {
            return Err(TbError::WrongArity);
        };
        // SAFETY: as in `Single::open`.
        requests.push(unsafe {
            parse_request(api.bytes(capacity), api.bytes(rate), Some(api.bytes(n)))
        }?);
        keys.push(*key);
    }
    // Hashing keeps the whole command linear in the number of keys: it runs
    // on the server's only command thread, and a quadratic check made one
    // call with 20,000 keys stall every client for more than a second.
    let mut seen = HashSet::with_capacity(count);
    // SAFETY: as in `Single::open`.
    if !keys
        .iter()
        .all(|key| seen.insert(unsafe { api.bytes(key) }))
    {
        return Err(TbError::DuplicateKey);
    }
    drop(seen);
    let mut buckets = Vec::with_capacity(count);
    let mut charges = Vec::with_capacity(count);
    for (index, (key, request)) in keys.iter().zip(&requests).enumerate() {
        // SAFETY: as in `Single::open`.
        let mut bucket = unsafe { BucketKey::open(api, ctx, *key, Access::Write) }?;
        charges.push(Charge {
            state: read(&mut bucket, index.saturating_mul(4).saturating_add(KEY_ARG))?,
            limit: request.limit,
            n: request.n,
            behind: queued_on(api, ctx, *key),
        });
        buckets.push(bucket);
    }
    let now_ms = now(api);
    let result = bucket::take_all(&charges, now_ms);
    let writes: Vec<(&BucketKey, &Outcome)> = buckets.iter().zip(&result.outcomes).collect();
    store(&writes, now_ms)?;
    // The deciding bucket allows exactly when the whole call does: a
    // denial is decided by a denying bucket (see `bucket::take_all`).
    let outcome = result
        .outcomes
        .get(result.decisive)
        .copied()
        .ok_or(TbError::Internal)?;
    count_decision(outcome.allowed, charges.iter().map(|charge| charge.n).sum());
    Ok(Reply::All {
        outcome: shadow(outcome),
        index: result.decisive,
    })
}

pub fn read(bucket: &mut BucketKey, key_arg: usize) -> Result<Option<bucket::State>, TbError> {
    bucket
        .read()
        .map_err(|Corrupt| TbError::CorruptBucket { key_arg })
}

/// Counts a TB.TAKE / TB.TAKEALL decision for `INFO tb`.
pub fn count_decision(allowed: bool, n: f64) {
    if allowed {
        metrics::ALLOWED.bump();
        metrics::TOKENS_GRANTED.add(n);
    } else {
        metrics::DENIED.bump();
    }
}

/// With `tb.shadow-mode yes`, a denial is reported as allowed (and counted
/// as `shadow_denied`) so a new limit can be watched in production before it
/// is enforced. Nothing is written for it: the bucket holds only what was
/// really taken, and retry_after_ms still says how long the caller would
/// have had to wait.
pub fn shadow(outcome: Outcome) -> Outcome {
    if outcome.allowed || !SHADOW_MODE.load(Relaxed) {
        return outcome;
    }
    metrics::SHADOW_DENIED.bump();
    Outcome {
        allowed: true,
        ..outcome
    }
}

pub fn now(api: &Api) -> i64 {
    api.now_ms()
}

pub type Handler =
    fn(&Api, *mut RedisModuleCtx, &[*mut RedisModuleString]) -> Result<Reply, TbError>;

/// Runs a handler and sends its reply. A panic (a bug: no input should cause
/// one) would abort the whole server if it crossed this `extern "C"`
/// boundary, so it is caught here, logged by the panic hook, and answered
/// with an error instead.
pub fn run(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let Some(api) = api::api() else {
        return raw::REDISMODULE_ERR as c_int;
    };
    let args: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: the server passes argc valid string pointers in argv.
        Ok(len) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, len) },
        _ => &[],
    };
    let result = catch_unwind(AssertUnwindSafe(|| handler(api, ctx, args)))
        .unwrap_or(Err(TbError::Internal));
    send(api, ctx, args, result);
    raw::REDISMODULE_OK as c_int
}

/// Sends a reply (or an error naming its argument from `args`) on `ctx`,
/// and counts it: a reply is a call, an error an error.
pub fn send(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
    result: Result<Reply, TbError>,
) {
    match &result {
        Ok(Reply::Blocked) => return,
        Ok(_) => metrics::CALLS.bump(),
        Err(_) => metrics::ERRORS.bump(),
    }
    // SAFETY: replying on a context that has a client (a command's, or a
    // blocked client's callback).
    unsafe {
        match result {
            Ok(Reply::Blocked) => {}
            Ok(Reply::Decision(outcome)) => reply_outcome(api, ctx, &outcome, None),
            Ok(Reply::All { outcome, index }) => {
                let index = i64::try_from(index).unwrap_or(i64::MAX);
                reply_outcome(api, ctx, &outcome, Some(index));
            }
            Ok(Reply::Lease(lease)) => reply_lease(api, ctx, &lease),
            Ok(Reply::Flag(flag)) => {
                (api.reply_with_long_long)(ctx, i64::from(flag));
            }
            Err(TbError::WrongArity) => {
                (api.wrong_arity)(ctx);
            }
            Err(TbError::CorruptLeaseSet { key_arg }) => {
                let key = args
                    .get(key_arg)
                    .map(|key| api.bytes(key))
                    .unwrap_or_default();
                let message = corrupt_lease_set_message(key);
                (api.reply_with_error)(ctx, message.as_ptr());
            }
            Err(TbError::CorruptBucket { key_arg }) => {
                let key = args
                    .get(key_arg)
                    .map(|key| api.bytes(key))
                    .unwrap_or_default();
                let message = corrupt_bucket_message(key);
                (api.reply_with_error)(ctx, message.as_ptr());
            }
            Err(error) => {
                (api.reply_with_error)(ctx, error.message().as_ptr());
            }
        }
    }
}

pub extern "C" fn tb_take(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, take)
}

pub extern "C" fn tb_peek(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, peek)
}

pub extern "C" fn tb_refund(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, refund)
}

pub extern "C" fn tb_takeall(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, take_all)
}

/// `[allowed, remaining, retry_after_ms, reset_after_ms]`, and the deciding
/// bucket's index for TB.TAKEALL.
///
/// # Safety
/// `ctx` must be a context with a client.
unsafe fn reply_outcome(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    outcome: &Outcome,
    index: Option<i64>,
) {
    (api.reply_with_array)(ctx, if index.is_some() { 5 } else { 4 } as c_long);
    (api.reply_with_long_long)(ctx, i64::from(outcome.allowed));
    (api.reply_with_long_long)(ctx, outcome.remaining);
    (api.reply_with_long_long)(ctx, outcome.retry_after_ms);
    (api.reply_with_long_long)(ctx, outcome.reset_after_ms);
    if let Some(index) = index {
        (api.reply_with_long_long)(ctx, index);
    }
}

/// `[acquired, available, retry_after_ms, lease]`, the lease a bulk string
/// or nil.
///
/// # Safety
/// `ctx` must be a context with a client.
unsafe fn reply_lease(api: &Api, ctx: *mut RedisModuleCtx, lease: &LeaseReply) {
    (api.reply_with_array)(ctx, 4);
    (api.reply_with_long_long)(ctx, i64::from(lease.id.is_some()));
    (api.reply_with_long_long)(ctx, lease.available);
    (api.reply_with_long_long)(ctx, lease.retry_after_ms);
    match lease.id {
        Some(id) => {
            let text = id.text();
            let bytes = text.as_bytes();
            (api.reply_with_string_buffer)(ctx, bytes.as_ptr().cast(), bytes.len());
        }
        None => {
            (api.reply_with_null)(ctx);
        }
    }
}

//! The bucket commands TB.TAKE, TB.PEEK, TB.REFUND, TB.TAKEALL, TB.CHARGE
//! and TB.UNBLOCK, one handler each, and the shadow-mode policy. Each handler reads the clock
//! once, judges with the core's pure arithmetic (`bucket.rs`), stores
//! through hash.rs and replies through the server's reply frame; TB.BTAKE's
//! waiting lives in btake.rs.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;

use redis_tb_core::args::{
    self, parse_charge_options, parse_request, parse_take_options, take_all_options_start,
};
use redis_tb_core::bucket::{self, Charge, Outcome, TakeOptions};
use redis_tb_core::error::TbError;
use redis_tb_core::wait::tokens::TokenMachine;

use super::hash::{write_all, BucketKey, Corrupt};
use crate::server::config::SHADOW_MODE;
use crate::server::context::Context;
use crate::server::keys::Access;
use crate::server::machines::with_machine;
use crate::server::metrics;
use crate::server::reply::{entry_point, Reply, KEY_ARG};
use crate::server::strings::ServerStr;
use crate::server::top;

/// TB.TAKE key capacity rate n [MAXWAIT ms] [BLOCK ms [MAXBLOCK ms]]
///
/// Refill by elapsed time, cap at capacity, take n if there are that many
/// (and no TB.BTAKE caller waits on the bucket: see `bucket::take_behind`).
/// With MAXWAIT, reserve into debt; with BLOCK, a denial locks the key
/// (`bucket::take_with`).
fn take(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let (key, request, options) = request_and_options(args)?;
    let options = take_options(options)?;
    let mut single = Single::open_request(ctx, key, request, Access::Write)?;
    single.charge.options = options;
    let outcome = single.charge.judge(single.now_ms);
    write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
    count_decision(&outcome, single.charge.n, key.bytes(), single.now_ms);
    Ok(Reply::Decision(shadow(outcome)))
}

/// `key capacity rate n [options...]` of TB.TAKE and TB.CHARGE: the key,
/// the parsed request and the words after `n`, checked in argument order.
#[inline]
fn request_and_options(
    args: &[ServerStr],
) -> Result<(&ServerStr, args::Request, &[ServerStr]), TbError> {
    let [_, key, capacity, rate, n, options @ ..] = args else {
        return Err(TbError::WrongArity);
    };
    let request = parse_request(capacity, rate, Some(n))?;
    Ok((key, request, options))
}

/// The bytes of command arguments, for the option parsers.
fn words(args: &[ServerStr]) -> Vec<&[u8]> {
    args.iter().map(ServerStr::bytes).collect()
}

/// The options of TB.TAKE / TB.TAKEALL from server strings; none (the usual
/// case) costs nothing. In shadow mode `BLOCK` is checked but not applied:
/// a denial there is reported as allowed and writes nothing, so it starts
/// no lock either (locks already stored still hold, and are reported the
/// same way).
fn take_options(options: &[ServerStr]) -> Result<TakeOptions, TbError> {
    if options.is_empty() {
        return Ok(TakeOptions::PLAIN);
    }
    let options = parse_take_options(&words(options))?;
    if SHADOW_MODE.load(Relaxed) {
        return Ok(TakeOptions {
            block: None,
            ..options
        });
    }
    Ok(options)
}

/// TB.CHARGE key capacity rate n [MAXDEBT d]
///
/// Takes n whatever the bucket holds, into debt down to -d (d defaults to
/// the capacity): a cost known only after the work (`bucket::debit`).
/// Always allowed; later takes wait until the debt is repaid. Locks and
/// TB.BTAKE queues do not stop it: the work is done already.
fn charge(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let (key, request, options) = request_and_options(args)?;
    let max_debt = parse_charge_options(&words(options))?.unwrap_or(request.limit.capacity);
    let single = Single::open_request(ctx, key, request, Access::Write)?;
    let charge = &single.charge;
    let debited = bucket::debited(
        charge.state,
        &charge.limit,
        charge.n,
        max_debt,
        single.now_ms,
    );
    write_all(&[(&single.bucket, &debited.outcome)], single.now_ms)?;
    metrics::CHARGES.bump();
    // What was really taken, as the refund counter counts what was added.
    metrics::TOKENS_CHARGED.add(debited.charged);
    Ok(Reply::Decision(debited.outcome))
}

/// TB.UNBLOCK key
///
/// Ends the key's lock and forgets its strikes: 1 if there was a lock or a
/// strike to forget (then `HDEL` is replicated), else 0 with nothing
/// written. The bucket's tokens stay as they are.
fn unblock(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let [_, key] = args else {
        return Err(TbError::WrongArity);
    };
    let bucket = BucketKey::open(ctx, key, Access::Write)?;
    Ok(Reply::Flag(bucket.delete_lock()?))
}

/// TB.PEEK key capacity rate [n]
///
/// The reply TB.TAKE would give, without taking or writing anything, so it
/// is read-only and runs on replicas. A `last_refill` in the future is
/// answered as if repaired, though only a write command stores the repair.
fn peek(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let single = Single::open(ctx, args, Access::Read)?;
    Ok(Reply::Decision(single.charge.judge(single.now_ms)))
}

/// TB.REFUND key capacity rate n
///
/// Gives n tokens back (refill first, then add, capped at capacity), for a
/// request that failed for the caller's own reasons. Its write wakes the
/// TB.BTAKE queue of the bucket, if it has one (the blocking glue,
/// src/server/blocking.rs, listens to the key's events).
fn refund(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let [_, key, capacity, rate, n] = args else {
        return Err(TbError::WrongArity);
    };
    let single = Single::open_parts(ctx, key, [capacity, rate], Some(n), Access::Write)?;
    let charge = &single.charge;
    let refunded = bucket::refund(charge.state, &charge.limit, charge.n, single.now_ms);
    write_all(&[(&single.bucket, &refunded.outcome)], single.now_ms)?;
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
    fn open(ctx: Context<'a>, args: &'a [ServerStr], access: Access) -> Result<Self, TbError> {
        match (args, access) {
            ([_, key, capacity, rate, n], Access::Read) => {
                Single::open_parts(ctx, key, [capacity, rate], Some(n), access)
            }
            ([_, key, capacity, rate], Access::Read) => {
                Single::open_parts(ctx, key, [capacity, rate], None, access)
            }
            _ => Err(TbError::WrongArity),
        }
    }

    /// `key`, `[capacity, rate]` and `n` as the command's arguments.
    pub fn open_parts(
        ctx: Context<'a>,
        key: &'a ServerStr,
        [capacity, rate]: [&ServerStr; 2],
        n: Option<&ServerStr>,
        access: Access,
    ) -> Result<Self, TbError> {
        let request = parse_request(capacity, rate, n.map(ServerStr::bytes))?;
        Single::open_request(ctx, key, request, access)
    }

    /// `key` with a request already parsed.
    pub fn open_request(
        ctx: Context<'a>,
        key: &'a ServerStr,
        request: args::Request,
        access: Access,
    ) -> Result<Self, TbError> {
        let mut bucket = BucketKey::open(ctx, key, access)?;
        let state = read(&mut bucket, KEY_ARG)?;
        // The clock is read once; the refill, the reply and the deadline all
        // use this instant.
        Ok(Single {
            charge: Charge {
                state,
                limit: request.limit,
                n: request.n,
                behind: queued_on(ctx, key),
                lock: bucket.lock(),
                options: TakeOptions::PLAIN,
            },
            bucket,
            now_ms: ctx.now_ms(),
        })
    }
}

/// The tokens TB.BTAKE callers waiting on `key` want, if any wait: the
/// commands leave those tokens to the queue (`bucket::take_behind`).
pub fn queued_on(ctx: Context, key: &ServerStr) -> Option<f64> {
    with_machine(|machine: &mut TokenMachine| {
        if machine.is_empty() {
            return None; // the usual case: no lookup at all
        }
        machine.queued(ctx.selected_db(), key)
    })
    .flatten()
}

/// TB.TAKEALL key capacity rate n [key capacity rate n ...] [options]
///
/// The options (TB.TAKE's) follow the last group and apply to every bucket.
/// Several limits on one request, all or nothing. Every argument is parsed,
/// and every key type-checked and read, before anything is written, so an
/// error or a denial leaves every bucket as it was (bar clock repairs, see
/// `bucket::seen_at`). The server runs the whole command at once, so no
/// client sees some buckets charged and others not; the replicated
/// HSET/PEXPIREAT pairs arrive in one MULTI/EXEC.
fn take_all(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let rest = args.get(1..).unwrap_or_default();
    let start = take_all_options_start(&words(rest));
    let (groups, options) = rest.split_at(start.min(rest.len()));
    if ctx.is_keys_position_request() {
        // Cluster routing and COMMAND GETKEYS: every group's first argument.
        for position in (0..groups.len()).step_by(4) {
            ctx.key_at_pos(args, position.saturating_add(1));
        }
        return Ok(Reply::KeysNamed);
    }
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
        requests.push(parse_request(capacity, rate, Some(n))?);
        keys.push(key);
    }
    let options = take_options(options)?;
    // Hashing keeps the whole command linear in the number of keys: it runs
    // on the server's only command thread, and a quadratic check made one
    // call with 20,000 keys stall every client for more than a second.
    let mut seen = HashSet::with_capacity(count);
    if !keys.iter().all(|key| seen.insert(key.bytes())) {
        return Err(TbError::DuplicateKey);
    }
    drop(seen);
    let mut buckets = Vec::with_capacity(count);
    let mut charges = Vec::with_capacity(count);
    for (index, (key, request)) in keys.iter().zip(&requests).enumerate() {
        let mut bucket = BucketKey::open(ctx, key, Access::Write)?;
        charges.push(Charge {
            state: read(&mut bucket, index.saturating_mul(4).saturating_add(KEY_ARG))?,
            limit: request.limit,
            n: request.n,
            behind: queued_on(ctx, key),
            lock: bucket.lock(),
            options,
        });
        buckets.push(bucket);
    }
    let now_ms = ctx.now_ms();
    let result = bucket::take_all(&charges, now_ms);
    let writes: Vec<(&BucketKey, &Outcome)> = buckets.iter().zip(&result.outcomes).collect();
    write_all(&writes, now_ms)?;
    // The deciding bucket allows exactly when the whole call does: a
    // denial is decided by a denying bucket (see `bucket::take_all`).
    let outcome = result
        .outcomes
        .get(result.decisive)
        .copied()
        .ok_or(TbError::Internal)?;
    let deciding_key = keys.get(result.decisive).map_or(&[][..], |key| key.bytes());
    count_decision(
        &outcome,
        charges.iter().map(|charge| charge.n).sum(),
        deciding_key,
        now_ms,
    );
    // Every denying bucket of the call starts its own lock; the deciding
    // one's was counted just now.
    let other_locks = result
        .outcomes
        .iter()
        .enumerate()
        .filter(|(index, each)| *index != result.decisive && each.lock.is_some())
        .count();
    metrics::LOCKS_STARTED.add_count(other_locks);
    Ok(Reply::All {
        outcome: shadow(outcome),
        index: result.decisive,
    })
}

pub fn read(bucket: &mut BucketKey, key_arg: usize) -> Result<Option<bucket::State>, TbError> {
    bucket.read().map_err(|corrupt| match corrupt {
        Corrupt::Bucket => TbError::CorruptBucket { key_arg },
        Corrupt::Lock => TbError::CorruptLock { key_arg },
    })
}

/// Counts a TB.TAKE / TB.TAKEALL decision for `INFO tb`: allowed or
/// denied, a reservation that waits, a lock it started.
pub fn count_decision(outcome: &Outcome, n: f64, key: &[u8], now_ms: i64) {
    if outcome.allowed {
        metrics::ALLOWED.bump();
        metrics::TOKENS_GRANTED.add(n);
        if outcome.retry_after_ms > 0 {
            metrics::RESERVATIONS_WAITED.bump();
        }
    } else {
        metrics::DENIED.bump();
        top::denied(key, SHADOW_MODE.load(Relaxed), now_ms);
    }
    if outcome.lock.is_some() {
        metrics::LOCKS_STARTED.bump();
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

entry_point!(pub tb_take => take);
entry_point!(pub tb_peek => peek);
entry_point!(pub tb_refund => refund);
entry_point!(pub tb_charge => charge);
entry_point!(pub tb_unblock => unblock);
entry_point!(pub tb_takeall => take_all);

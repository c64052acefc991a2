//! TB.THROTTLE key max_burst count period [quantity]: redis-cell's
//! `CL.THROTTLE` contract on redis-tb's bucket (the mapping is pure, in
//! core/src/throttle.rs). Also registered as `CL.THROTTLE` with the load
//! argument `cell-compat yes`.
//!
//! A key redis-cell wrote (a string holding its TAT in Unix ns) is read as
//! the bucket it stands for (`throttle::from_cell`), so a deployment can
//! switch from redis-cell to redis-tb without resetting its limits. The
//! first call that writes converts the key: the string is deleted and the
//! bucket's hash written in its place (replicated as `DEL`, `HSET`,
//! `PEXPIREAT`). A denial writes nothing and leaves the string as it was.
//! Only this command reads such strings; the other TB.* commands answer
//! WRONGTYPE, and a hash key costs nothing more than before.

use std::os::raw::c_int;

use redis_module::raw::{
    self, RedisModuleCtx, RedisModuleKey, RedisModuleString, REDISMODULE_KEYTYPE_EMPTY,
    REDISMODULE_KEYTYPE_STRING, REDISMODULE_NOTIFY_GENERIC, REDISMODULE_OK, REDISMODULE_READ,
};
use redis_tb_core::args::Request;
use redis_tb_core::bucket::{self, Charge, Outcome, State, TakeOptions};
use redis_tb_core::error::TbError;
use redis_tb_core::throttle::{self, from_cell, parse_tat, parse_throttle};

use super::commands::{count_decision, queued_on, shadow, Single};
use super::hash::{write_all, BucketKey, WriteFailed};
use crate::server::api::Api;
use crate::server::keys::{open_key, Access, ServerString};
use crate::server::reply::{entry_point, now, Reply};

/// TB.THROTTLE key max_burst count period [quantity]
///
/// A plain TB.TAKE of `quantity` (default 1) on the bucket of capacity
/// `max_burst + 1` refilled at `count / period` per second, answered as
/// redis-cell answers: `[limited, limit, remaining, retry_after,
/// reset_after]` in whole seconds.
fn throttle_command(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let (key, max_burst, count, period, quantity) = match args {
        [_, key, max_burst, count, period] => (key, max_burst, count, period, None),
        [_, key, max_burst, count, period, quantity] => {
            (key, max_burst, count, period, Some(quantity))
        }
        _ => return Err(TbError::WrongArity),
    };
    // SAFETY: argv strings live for the whole command.
    let parsed = unsafe {
        parse_throttle(
            api.bytes(max_burst),
            api.bytes(count),
            api.bytes(period),
            quantity.map(|quantity| api.bytes(quantity)),
        )
    }?;
    let request = Request {
        limit: parsed.limit,
        n: parsed.n,
    };
    let single = match Single::open_request(api, ctx, *key, request, Access::Write) {
        // Not a hash: perhaps redis-cell's string (off the hot path).
        Err(TbError::WrongType) => return cell_key(api, ctx, *key, request),
        other => other?,
    };
    let outcome = single.charge.judge(single.now_ms);
    write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
    Ok(answer(outcome, &request))
}

fn answer(outcome: Outcome, request: &Request) -> Reply {
    count_decision(&outcome, request.n);
    Reply::Integers(throttle::reply(&shadow(outcome), &request.limit))
}

/// TB.THROTTLE on a key that is not a hash: a string holding an integer is
/// redis-cell's TAT, judged as the bucket it stands for; anything else is
/// WRONGTYPE.
fn cell_key(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    request: Request,
) -> Result<Reply, TbError> {
    // SAFETY: the command's live context and argument.
    let cell = unsafe { CellKey::open(api, ctx, name) }?;
    let Some(tat_ns) = cell.tat_ns()? else {
        // Gone between the two opens (expired, on a server whose clock is
        // not cached per command): simply a missing bucket.
        drop(cell);
        let single = Single::open_request(api, ctx, name, request, Access::Write)?;
        let outcome = single.charge.judge(single.now_ms);
        write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
        return Ok(answer(outcome, &request));
    };
    let now_ms = now(api);
    let charge = Charge {
        state: Some(from_cell(tat_ns, &request.limit, now_ms)),
        limit: request.limit,
        n: request.n,
        behind: queued_on(api, ctx, name),
        lock: None,
        options: TakeOptions::PLAIN,
    };
    let outcome = charge.judge(now_ms);
    if let Some(state) = &outcome.write {
        cell.convert(state, &outcome, now_ms)?;
    }
    Ok(answer(outcome, &request))
}

/// A key redis-cell wrote, open for writing; closed when dropped.
struct CellKey<'a> {
    api: &'a Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: *mut RedisModuleKey,
}

impl<'a> CellKey<'a> {
    /// Opens `name`, empty or a string (WRONGTYPE otherwise).
    ///
    /// # Safety
    /// `ctx` and `name` must be the command's live context and argument.
    unsafe fn open(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
    ) -> Result<Self, TbError> {
        let key = open_key(api, ctx, name, Access::Write, REDISMODULE_KEYTYPE_STRING)?;
        Ok(CellKey {
            api,
            ctx,
            name,
            key,
        })
    }

    fn is_empty(&self) -> bool {
        // SAFETY: `key` is open (or null, checked first).
        self.key.is_null()
            || unsafe { (self.api.key_type)(self.key) } as isize == REDISMODULE_KEYTYPE_EMPTY
    }

    /// The string's bytes, borrowed from the key (valid until it changes).
    fn value(&self) -> Result<&[u8], TbError> {
        // SAFETY: the key is open and holds a string; a read-mode DMA only
        // reads it, and the slice is dropped before the key is written.
        unsafe {
            let dma = raw::RedisModule_StringDMA.ok_or(TbError::Internal)?;
            let mut len = 0usize;
            let ptr = dma(self.key, &mut len, REDISMODULE_READ as c_int);
            if ptr.is_null() {
                return Err(TbError::Internal);
            }
            Ok(std::slice::from_raw_parts(ptr.cast::<u8>(), len))
        }
    }

    /// The TAT (Unix ns) the string holds, `None` if the key is gone; a
    /// string that is not an integer is WRONGTYPE.
    fn tat_ns(&self) -> Result<Option<i64>, TbError> {
        if self.is_empty() {
            return Ok(None);
        }
        parse_tat(self.value()?).map(Some).ok_or(TbError::WrongType)
    }

    /// Replaces the string with the bucket `state`: deleted, then the hash
    /// written with its deadline. Only once both stand are `DEL`, `HSET`
    /// and `PEXPIREAT` propagated; if the hash cannot be stored, the string
    /// is put back with its TTL and nothing is propagated.
    fn convert(self, state: &State, outcome: &Outcome, now_ms: i64) -> Result<(), TbError> {
        let api = self.api;
        let (ctx, name) = (self.ctx, self.name);
        let prior = ServerString::from_bytes(api, ctx, self.value()?);
        // SAFETY: the key is open (a string, so not null).
        let prior_expiry = unsafe {
            match api.get_abs_expire {
                Some(get_abs_expire) => Expiry::At(get_abs_expire(self.key)),
                None => Expiry::In((api.get_expire)(self.key)),
            }
        };
        if prior.ptr().is_null()
            // SAFETY: the key is open for writing.
            || unsafe { (api.delete_key)(self.key) } != REDISMODULE_OK as c_int
        {
            return Err(TbError::WriteFailed);
        }
        drop(self);
        // SAFETY: the command's live context and argument.
        let mut bucket = unsafe { BucketKey::open(api, ctx, name, Access::Write) }?;
        bucket.read().map_err(|_| TbError::Internal)?;
        let deadline_ms = bucket::deadline_ms(now_ms, outcome, None);
        let applied = match bucket.apply(state, None, now_ms, deadline_ms) {
            Ok(applied) => applied,
            Err(WriteFailed) => {
                drop(bucket);
                // SAFETY: as above.
                unsafe { restore(api, ctx, name, &prior, prior_expiry) };
                return Err(TbError::WriteFailed);
            }
        };
        // SAFETY: ctx/name are live for this command. The DEL goes first,
        // so a replica or a reloaded AOF replaces the string as we did.
        unsafe {
            (api.replicate)(ctx, c"DEL".as_ptr(), c"s".as_ptr(), name);
            (api.notify)(ctx, REDISMODULE_NOTIFY_GENERIC, c"del".as_ptr(), name);
        }
        bucket.propagate(&applied);
        Ok(())
    }
}

impl Drop for CellKey<'_> {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: opened by `open`, closed exactly once.
            unsafe { (self.api.close_key)(self.key) };
        }
    }
}

/// A redis-cell key's expiry before its conversion: absolute (Unix ms)
/// where the server tells it, else relative (ms); negative for none.
#[derive(Clone, Copy)]
enum Expiry {
    At(i64),
    In(i64),
}

/// Puts redis-cell's string back after a conversion whose hash could not
/// be stored (`apply` has deleted what it wrote): the value, and its
/// expiry.
///
/// # Safety
/// `ctx` and `name` must be the command's live context and argument.
unsafe fn restore(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    prior: &ServerString,
    prior_expiry: Expiry,
) {
    let expire = |key| match (prior_expiry, api.set_abs_expire) {
        (Expiry::At(at) | Expiry::In(at), _) if at < 0 => true,
        (Expiry::At(at), Some(set_abs_expire)) => {
            set_abs_expire(key, at) == REDISMODULE_OK as c_int
        }
        (Expiry::At(_), None) => false,
        (Expiry::In(ttl), _) => (api.set_expire)(key, ttl.max(1)) == REDISMODULE_OK as c_int,
    };
    let restored = match (
        raw::RedisModule_StringSet,
        open_key(api, ctx, name, Access::Write, REDISMODULE_KEYTYPE_STRING),
    ) {
        (Some(string_set), Ok(key)) if !key.is_null() => {
            let set = string_set(key, prior.ptr()) == REDISMODULE_OK as c_int && expire(key);
            (api.close_key)(key);
            set
        }
        (_, Ok(key)) => {
            if !key.is_null() {
                (api.close_key)(key);
            }
            false
        }
        _ => false,
    };
    if !restored {
        api.log(
            ctx,
            c"warning",
            "tb: could not put back a redis-cell key after a failed conversion; the key is lost on this server",
        );
    }
}

entry_point!(pub tb_throttle => throttle_command);

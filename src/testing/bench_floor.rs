//! Bench-only (feature `bench-floor`, never in the module users run): the
//! least a module command can do for an acquire and a release with the
//! lease-set layout and effects replication. bench/lease_bench.py races them
//! beside TB.ACQUIRE and TB.RELEASE to show how much of the target's time
//! is left once the unavoidable part is paid.
//!
//! - `TB.FLOOR.ACQUIRE key deadline_ms granted_ms n expire_at_ms`: stores the
//!   lease `<granted_ms>-<n>` (a set without incarnation, as before them) at
//!   `deadline_ms` and `seq` at `-n`, and, unless
//!   `expire_at_ms` is 0, the expiry; replies as TB.ACQUIRE does.
//! - `TB.FLOOR.RELEASE key lease`: removes `lease`; replies 1 or 0.
//! - `TB.FLOOR.TAKE key tokens deadline_ms`: stores `tokens` and
//!   `last_refill = now` in the bucket's hash with the absolute expiry, and
//!   replies four integers, as an allowed TB.TAKE does.
//!
//! They write and replicate through src/lease/set.rs and src/bucket/hash.rs,
//! the real commands' own code, but read nothing and check nothing: the
//! caller computed the values (the bench keeps each key's count and
//! expiry, or the tokens to store).

use std::ffi::CStr;

use redis_module::raw::RedisModuleCmdFunc;

use redis_tb_core::args::{parse_lease_ms, parse_timeout};
use redis_tb_core::bucket::State;
use redis_tb_core::error::TbError;
use redis_tb_core::lease::{Grant, LeaseId};
use redis_tb_core::number::{parse_decimal, Sign};
use redis_tb_core::wait::leases::LeaseReply;

use crate::bucket::hash::BucketKey;
use crate::lease::commands::open_for_release;
use crate::lease::set::{LeaseSet, Read};
use crate::server::context::Context;
use crate::server::keys::Access;
use crate::server::reply::{entry_point, Reply};
use crate::server::strings::ServerStr;

fn acquire(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let [_, key, deadline_ms, granted_ms, n, expire_at_ms] = args else {
        return Err(TbError::WrongArity);
    };
    let whole = |arg: &ServerStr| parse_lease_ms(arg);
    let expire_at_ms = parse_timeout(expire_at_ms)?;
    let grant = Grant {
        id: LeaseId {
            granted_ms: whole(granted_ms)?,
            n: whole(n)?,
            incarnation: None,
        },
        deadline_ms: whole(deadline_ms)?,
        available: 0,
        expire_at_ms: (expire_at_ms > 0).then_some(expire_at_ms),
        new_incarnation: None,
    };
    let set = LeaseSet::open(ctx, key, Access::Write)?;
    set.grant(&Read::nothing(), &[grant])?;
    Ok(Reply::Lease(LeaseReply {
        id: Some(grant.id),
        available: 0,
        retry_after_ms: 0,
    }))
}

fn release(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let (set, lease) = open_for_release(ctx, args)?;
    Ok(Reply::Flag(set.release(&Read::nothing(), lease)?))
}

/// TB.TAKE's floor: its write (two fields, the expiry, the effects, the
/// notifications) without its read or its arithmetic.
fn take(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let [_, key, tokens, deadline_ms] = args else {
        return Err(TbError::WrongArity);
    };
    let tokens = parse_decimal(tokens, Sign::Allowed).ok_or(TbError::Count)?;
    let deadline_ms = parse_lease_ms(deadline_ms)?;
    let now_ms = ctx.now_ms();
    let bucket = BucketKey::open(ctx, key, Access::Write)?;
    let state = State {
        tokens,
        last_refill_ms: now_ms as f64,
    };
    bucket.write(&state, None, now_ms, deadline_ms)?;
    Ok(Reply::Decision(redis_tb_core::bucket::Outcome {
        allowed: true,
        remaining: tokens.max(0.0).floor() as i64,
        retry_after_ms: 0,
        reset_after_ms: deadline_ms.saturating_sub(now_ms),
        write: None,
        lock: None,
    }))
}

entry_point!(tb_floor_take => take);
entry_point!(tb_floor_acquire => acquire);
entry_point!(tb_floor_release => release);

/// The three commands, which load.rs registers (first key 1, no docs:
/// bench-only).
pub const COMMANDS: [(&CStr, RedisModuleCmdFunc); 3] = [
    (c"tb.floor.take", Some(tb_floor_take)),
    (c"tb.floor.acquire", Some(tb_floor_acquire)),
    (c"tb.floor.release", Some(tb_floor_release)),
];

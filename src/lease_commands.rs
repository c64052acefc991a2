//! TB.ACQUIRE, TB.RELEASE and TB.RENEW: concurrency limits with leases
//! that end on the server's clock. Each handler parses its arguments in
//! order, opens the lease set, reads it once at one instant, decides with
//! the pure rules of `lease.rs` and stores through `lease_set.rs`.

use std::os::raw::c_int;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::api::Api;
use crate::args::{parse_lease_ms, parse_limit, parse_timeout};
use crate::commands::{now, run, Reply, KEY_ARG};
use crate::error::TbError;
use crate::lease::{self, Acquire, LeaseLimit};
use crate::lease_set::LeaseSet;
use crate::metrics;
use crate::store::Access;

/// What TB.ACQUIRE answers: `[acquired, available, retry_after_ms, lease]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseReply {
    pub id: Option<lease::LeaseId>,
    pub available: i64,
    pub retry_after_ms: i64,
}

/// TB.ACQUIRE key limit lease_ms [timeout_ms]
fn acquire(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let (key, limit, lease_ms, timeout) = match args {
        [_, key, limit, lease_ms] => (key, limit, lease_ms, None),
        [_, key, limit, lease_ms, timeout] => (key, limit, lease_ms, Some(timeout)),
        _ => return Err(TbError::WrongArity),
    };
    // SAFETY (all `bytes` calls): argv strings live for the whole command.
    let limit = LeaseLimit {
        limit: parse_limit(unsafe { api.bytes(limit) })?,
        lease_ms: parse_lease_ms(unsafe { api.bytes(lease_ms) })?,
    };
    let _timeout_ms = timeout
        .map(|timeout| parse_timeout(unsafe { api.bytes(timeout) }))
        .transpose()?;
    // SAFETY: the command's context and key.
    let set = unsafe { LeaseSet::open(api, ctx, *key, Access::Write) }?;
    let now_ms = now(api);
    let read = set.read(now_ms, KEY_ARG)?;
    let reply = match lease::acquire(&read.seen, &limit, 0, now_ms)? {
        Acquire::Granted(grant) => {
            set.grant(&read, &[grant])?;
            metrics::LEASES_ACQUIRED.bump();
            LeaseReply {
                id: Some(grant.id),
                available: grant.available,
                retry_after_ms: 0,
            }
        }
        Acquire::Denied {
            available,
            retry_after_ms,
        } => {
            metrics::LEASES_DENIED.bump();
            LeaseReply {
                id: None,
                available,
                retry_after_ms,
            }
        }
    };
    Ok(Reply::Lease(reply))
}

/// TB.RELEASE key lease
fn release(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let [_, key, lease] = args else {
        return Err(TbError::WrongArity);
    };
    // SAFETY: the command's context and key.
    let set = unsafe { LeaseSet::open(api, ctx, *key, Access::Write) }?;
    let now_ms = now(api);
    let read = set.read(now_ms, KEY_ARG)?;
    if live_deadline(api, &set, lease, now_ms).is_none() {
        return Ok(Reply::Flag(false));
    }
    set.release(&read, *lease)?;
    metrics::LEASES_RELEASED.bump();
    Ok(Reply::Flag(true))
}

/// TB.RENEW key lease lease_ms
fn renew(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let [_, key, lease, lease_ms] = args else {
        return Err(TbError::WrongArity);
    };
    // SAFETY: an argv string.
    let lease_ms = parse_lease_ms(unsafe { api.bytes(lease_ms) })?;
    // SAFETY: the command's context and key.
    let set = unsafe { LeaseSet::open(api, ctx, *key, Access::Write) }?;
    let now_ms = now(api);
    let read = set.read(now_ms, KEY_ARG)?;
    let current = live_deadline(api, &set, lease, now_ms);
    let Some((deadline_ms, expire_at_ms)) = lease::renew(&read.seen, current, lease_ms, now_ms)
    else {
        return Ok(Reply::Flag(false));
    };
    set.renew(&read, *lease, deadline_ms, expire_at_ms)?;
    metrics::LEASES_RENEWED.bump();
    Ok(Reply::Flag(true))
}

/// The deadline of `lease` if it is a lease id held live in `set`; a
/// member that is not shaped like an id (`seq`, anything else) is never
/// looked up, so no argument can touch it.
fn live_deadline(
    api: &Api,
    set: &LeaseSet,
    lease: &*mut RedisModuleString,
    now_ms: i64,
) -> Option<i64> {
    // SAFETY: an argv string.
    if !lease::is_lease_id(unsafe { api.bytes(lease) }) {
        return None;
    }
    let deadline_ms = crate::lease_set::whole_ms(set.score(*lease)?);
    lease::is_live(deadline_ms, now_ms).then_some(deadline_ms)
}

pub extern "C" fn tb_acquire(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, acquire)
}

pub extern "C" fn tb_release(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, release)
}

pub extern "C" fn tb_renew(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, renew)
}

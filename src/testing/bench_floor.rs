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
//!
//! They write and replicate through src/lease/set.rs, the real commands' own
//! code, but read nothing and check nothing: the caller computed the values
//! (the bench keeps each key's count and expiry). TB.TAKE's floor,
//! `TB.FLOOR.TAKE`, shares the bucket's write and so lives beside it, in
//! src/bucket/floor.rs; load.rs registers all three.

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use redis_tb_core::args::{parse_lease_ms, parse_timeout};
use redis_tb_core::error::TbError;
use redis_tb_core::lease::{Grant, LeaseId};
use redis_tb_core::wait::leases::LeaseReply;

use crate::lease::commands::open_for_release;
use crate::lease::set::{LeaseSet, Read};
use crate::server::api::Api;
use crate::server::keys::Access;
use crate::server::reply::{entry_point, Reply};

fn acquire(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let [_, key, deadline_ms, granted_ms, n, expire_at_ms] = args else {
        return Err(TbError::WrongArity);
    };
    // SAFETY (all `bytes` calls): argv strings live for the whole command.
    let whole = |arg: &*mut RedisModuleString| parse_lease_ms(unsafe { api.bytes(arg) });
    let expire_at_ms = parse_timeout(unsafe { api.bytes(expire_at_ms) })?;
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
    // SAFETY: the command's context and key.
    let set = unsafe { LeaseSet::open(api, ctx, *key, Access::Write) }?;
    set.grant(&Read::nothing(), &[grant])?;
    Ok(Reply::Lease(LeaseReply {
        id: Some(grant.id),
        available: 0,
        retry_after_ms: 0,
    }))
}

fn release(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let (set, lease) = open_for_release(api, ctx, args)?;
    Ok(Reply::Flag(set.release(&Read::nothing(), lease)?))
}

entry_point!(pub tb_floor_acquire => acquire);
entry_point!(pub tb_floor_release => release);

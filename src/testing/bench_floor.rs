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
//! (the bench keeps each key's count and expiry). TB.TAKE's floor lives
//! beside the bucket's write it shares, in src/bucket/floor.rs.

use std::ffi::CStr;

use redis_module::raw::RedisModuleCmdFunc;

use redis_tb_core::args::{parse_lease_ms, parse_timeout};
use redis_tb_core::error::TbError;
use redis_tb_core::lease::{Grant, LeaseId};
use redis_tb_core::wait::leases::LeaseReply;

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

entry_point!(tb_floor_acquire => acquire);
entry_point!(tb_floor_release => release);

/// The lease floor's two commands, which load.rs registers with TB.TAKE's
/// (first key 1, no docs: bench-only).
pub const COMMANDS: [(&CStr, RedisModuleCmdFunc); 2] = [
    (c"tb.floor.acquire", Some(tb_floor_acquire)),
    (c"tb.floor.release", Some(tb_floor_release)),
];

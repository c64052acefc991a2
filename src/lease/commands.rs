//! TB.ACQUIRE, TB.RELEASE and TB.RENEW: concurrency limits with leases
//! that end on the server's clock. Each handler parses its arguments in
//! order, opens the lease set, reads it once at one instant, decides with
//! the core's pure rules (`lease.rs`) and stores through set.rs.
//!
//! A TB.ACQUIRE with `timeout_ms` that cannot have a lease at once waits in
//! the same state machine as TB.BTAKE (core/src/wait/mod.rs, glue in
//! src/server/blocking.rs), as lease wait (core/src/wait/leases.rs; its
//! server side, `GlueKind`, is here): first come first served per key,
//! served at the wake-ups a release, a lease's end, a DEL or a flush brings.

use redis_tb_core::args::{parse_lease_ms, parse_limit, parse_timeout};
use redis_tb_core::error::TbError;
use redis_tb_core::lease::{self, Acquire, LeaseLimit};
use redis_tb_core::wait;
use redis_tb_core::wait::leases::{LeaseReply, Leases, LeasesServed};

use super::set::LeaseSet;
use crate::server::blocking::{self, GlueKind};
use crate::server::context::Context;
use crate::server::keys::Access;
use crate::server::machines::with_machine;
use crate::server::metrics;
use crate::server::reply::{entry_point, send, Reply, KEY_ARG};
use crate::server::strings::ServerStr;
use crate::server::top;

/// TB.ACQUIRE key limit lease_ms [timeout_ms]
fn acquire(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let (key, limit, lease_ms, timeout) = match args {
        [_, key, limit, lease_ms] => (key, limit, lease_ms, None),
        [_, key, limit, lease_ms, timeout] => (key, limit, lease_ms, Some(timeout)),
        _ => return Err(TbError::WrongArity),
    };
    let limit = LeaseLimit {
        limit: parse_limit(limit)?,
        lease_ms: parse_lease_ms(lease_ms)?,
    };
    let timeout_ms = timeout.map(|timeout| parse_timeout(timeout)).transpose()?;
    let mut set = LeaseSet::open(ctx, key, Access::Write)?;
    let now_ms = ctx.now_ms();
    let read = set.read(now_ms, KEY_ARG)?;
    let (db, name) = (ctx.selected_db(), key.bytes());
    let waiting = waiting_on(db, name);
    let reply = match lease::acquire(&read.seen, &limit, waiting, now_ms)? {
        Acquire::Granted(grant) => {
            set.grant(&read, &[grant])?;
            metrics::LEASES_ACQUIRED.bump();
            LeaseReply {
                id: Some(grant.id),
                available: grant.available,
                retry_after_ms: 0,
            }
        }
        Acquire::Denied { retry_after_ms, .. }
            if timeout_ms.is_some() && blocking::may_block(ctx) =>
        {
            blocking::room::<Leases>(db, name)?;
            drop(read);
            drop(set);
            let timeout_ms = timeout_ms.unwrap_or(0);
            blocking::block::<Leases>(ctx, key, (db, name), limit, timeout_ms, retry_after_ms)?;
            return Ok(Reply::Blocked);
        }
        Acquire::Denied {
            available,
            retry_after_ms,
        } => {
            metrics::LEASES_DENIED.bump();
            top::denied(name, false, now_ms);
            LeaseReply {
                id: None,
                available,
                retry_after_ms,
            }
        }
    };
    Ok(Reply::Lease(reply))
}

/// How many TB.ACQUIRE callers wait on `name` in `db`: a newcomer queues
/// behind them. A lookup only when somebody waits somewhere.
fn waiting_on(db: wait::Db, name: &[u8]) -> i64 {
    with_machine::<Leases, _>(|machine| {
        if machine.is_empty() {
            return 0;
        }
        i64::try_from(machine.waiting_on(db, name)).unwrap_or(i64::MAX)
    })
    .unwrap_or(0)
}

/// `key lease`, TB.RELEASE's arguments: the lease set, open for writing,
/// and the lease named.
pub fn open_for_release<'a>(
    ctx: Context<'a>,
    args: &'a [ServerStr],
) -> Result<(LeaseSet<'a>, &'a ServerStr), TbError> {
    let [_, key, lease] = args else {
        return Err(TbError::WrongArity);
    };
    let set = LeaseSet::open(ctx, key, Access::Write)?;
    Ok((set, lease))
}

/// TB.RELEASE key lease
fn release(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let (mut set, lease) = open_for_release(ctx, args)?;
    let now_ms = ctx.now_ms();
    let read = set.read_ended(now_ms, KEY_ARG)?;
    let id = lease.bytes();
    let live = if !lease::is_lease_id(id) {
        false
    } else if read.all_ended_seen {
        // Every ended member is in `read.expired`: the lease is live if it
        // is anywhere else, which the removal itself tells, so the set is
        // searched once, not twice.
        !read.expired.iter().any(|ended| ended.bytes() == id)
    } else {
        live_deadline(&set, lease, now_ms).is_some()
    };
    if !live || !set.release(&read, lease)? {
        return Ok(Reply::Flag(false));
    }
    metrics::LEASES_RELEASED.bump();
    Ok(Reply::Flag(true))
}

/// TB.RENEW key lease lease_ms
fn renew(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let [_, key, lease, lease_ms] = args else {
        return Err(TbError::WrongArity);
    };
    let lease_ms = parse_lease_ms(lease_ms)?;
    let mut set = LeaseSet::open(ctx, key, Access::Write)?;
    let now_ms = ctx.now_ms();
    let read = set.read_for_renewal(now_ms, KEY_ARG)?;
    let current = live_deadline(&set, lease, now_ms);
    let Some((deadline_ms, expire_at_ms)) = lease::renew(&read.seen, current, lease_ms, now_ms)
    else {
        return Ok(Reply::Flag(false));
    };
    set.renew(&read, lease, deadline_ms, expire_at_ms)?;
    metrics::LEASES_RENEWED.bump();
    Ok(Reply::Flag(true))
}

/// The deadline of `lease` if it is a lease id held live in `set`; a
/// member that is not shaped like an id (`seq`, anything else) is never
/// looked up, so no argument can touch it.
fn live_deadline(set: &LeaseSet, lease: &ServerStr, now_ms: i64) -> Option<i64> {
    if !lease::is_lease_id(lease) {
        return None;
    }
    let deadline_ms = super::set::whole_ms(set.score(lease)?);
    lease::is_live(deadline_ms, now_ms).then_some(deadline_ms)
}

entry_point!(pub tb_acquire => acquire);
entry_point!(pub tb_release => release);
entry_point!(pub tb_renew => renew);

// --- The kind: leases, on the server --------------------------------------

impl GlueKind for Leases {
    fn read(ctx: Context, key: &ServerStr, now_ms: i64) -> Result<LeasesServed, TbError> {
        let mut set = LeaseSet::open(ctx, key, Access::Read).map_err(|_| TbError::LeaseSetGone)?;
        let read = set
            .read(now_ms, KEY_ARG)
            .map_err(|_| TbError::LeaseSetGone)?;
        Ok(LeasesServed {
            seen: read.seen,
            grants: Vec::new(),
        })
    }

    fn write(
        ctx: Context,
        key: &ServerStr,
        state: &LeasesServed,
        now_ms: i64,
    ) -> Result<(), TbError> {
        let mut set = LeaseSet::open(ctx, key, Access::Write).map_err(|_| TbError::LeaseSetGone)?;
        // Read again in the same callback, so nothing changed since the
        // grants were decided; this read also lists the ended leases the
        // write removes.
        let read = set
            .read(now_ms, KEY_ARG)
            .map_err(|_| TbError::LeaseSetGone)?;
        set.grant(&read, &state.grants)
    }

    fn exists(ctx: Context, key: &ServerStr) -> bool {
        LeaseSet::open(ctx, key, Access::Read).is_ok_and(|set| set.exists())
    }

    fn reply(
        ctx: Context,
        key: &[u8],
        result: Result<LeaseReply, TbError>,
        _request: &LeaseLimit,
        waited_ms: i64,
    ) {
        match result {
            Ok(reply) if reply.id.is_some() => {
                metrics::WAITS_SERVED.bump();
                metrics::LEASES_ACQUIRED.bump();
            }
            Ok(_) => {
                metrics::WAITS_TIMED_OUT.bump();
                metrics::LEASES_DENIED.bump();
                top::denied(key, false, ctx.wall_ms());
            }
            Err(_) => {}
        }
        metrics::WAIT_MS.add(waited_ms as f64);
        send(ctx, &[], result.map(Reply::Lease));
    }

    fn waiting(count: usize) {
        metrics::LEASE_WAITING.set(u64::try_from(count).unwrap_or(u64::MAX));
    }
}

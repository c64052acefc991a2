//! TB.THROTTLE key max_burst count period [quantity]: redis-cell's
//! `CL.THROTTLE` contract on redis-tb's bucket (the mapping is pure, in
//! core/src/throttle.rs). Also registered as `CL.THROTTLE` with the load
//! argument `cell-compat yes`.

use std::os::raw::c_int;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};
use redis_tb_core::args::Request;
use redis_tb_core::error::TbError;
use redis_tb_core::throttle::{self, parse_throttle};

use super::commands::{count_decision, shadow, Single};
use super::hash::write_all;
use crate::server::api::Api;
use crate::server::keys::Access;
use crate::server::reply::{run, Reply};

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
    let single = Single::open_request(api, ctx, *key, request, Access::Write)?;
    let outcome = single.charge.judge(single.now_ms);
    write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
    count_decision(&outcome, request.n);
    Ok(Reply::Integers(throttle::reply(
        &shadow(outcome),
        &request.limit,
    )))
}

pub extern "C" fn tb_throttle(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, throttle_command)
}

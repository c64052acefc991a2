//! Bench-only (feature `bench-floor`, never in the module users run):
//! `TB.FLOOR.TAKE key tokens deadline_ms`, TB.TAKE's floor. It stores
//! `tokens` and `last_refill = now` in the bucket's hash with the absolute
//! expiry and replies four integers, as an allowed TB.TAKE does: TB.TAKE's
//! own write (two fields, the expiry, the effects, the notifications)
//! through hash.rs, without its read or its arithmetic. bench/bench.py races
//! it beside TB.TAKE. It lives beside hash.rs, whose write it shares, so
//! that testing/ names nothing of bucket/; load.rs registers it with the
//! lease floor of src/testing/bench_floor.rs.

use redis_tb_core::args::parse_lease_ms;
use redis_tb_core::bucket::{Outcome, State};
use redis_tb_core::error::TbError;
use redis_tb_core::number::{parse_decimal, Sign};

use super::hash::BucketKey;
use crate::server::context::Context;
use crate::server::keys::Access;
use crate::server::reply::{entry_point, Reply};
use crate::server::strings::ServerStr;

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
    Ok(Reply::Decision(Outcome {
        allowed: true,
        remaining: tokens.max(0.0).floor() as i64,
        retry_after_ms: 0,
        reset_after_ms: deadline_ms.saturating_sub(now_ms),
        write: None,
        lock: None,
    }))
}

entry_point!(pub tb_floor_take => take);

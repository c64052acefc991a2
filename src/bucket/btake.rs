//! TB.BTAKE key capacity rate n timeout_ms: wait in the server, first come
//! first served, until the bucket holds n.
//!
//! The command itself, and the server side of token wait, the kind of wait
//! it is (whose pure rules, what a waiter asks for and how a wake-up serves
//! it, are core/src/wait/tokens.rs): how the bucket is read and written,
//! the reply sent and the waits counted (`GlueKind`). The waiting itself is
//! the core's state machine (core/src/wait/mod.rs); blocking the client and every
//! server callback are in src/server/blocking.rs, shared with TB.ACQUIRE.

use std::sync::atomic::Ordering::Relaxed;

use redis_tb_core::args::{parse_request, parse_timeout, Request};
use redis_tb_core::bucket::Outcome;
use redis_tb_core::error::TbError;
use redis_tb_core::wait::tokens::{Served, Tokens};

use super::commands::{count_decision, shadow, Single};
use super::hash::{write_all, BucketKey};
use crate::server::blocking::{self, GlueKind};
use crate::server::config::SHADOW_MODE;
use crate::server::context::Context;
use crate::server::keys::Access;
use crate::server::metrics;
use crate::server::reply::{entry_point, send, Reply};
use crate::server::strings::ServerStr;

/// TB.BTAKE key capacity rate n timeout_ms
///
/// Exactly TB.TAKE when it can be granted at once (or may not wait: inside
/// MULTI, a script, or where the server forbids blocking; in shadow mode;
/// or on a locked key, which denies at once); otherwise the client waits
/// behind those already waiting on the key. Waiters already queued when a
/// lock starts are served as their tokens come: the lock turns away new
/// callers, not those it found waiting.
fn btake(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let [_, key, capacity, rate, n, timeout] = args else {
        return Err(TbError::WrongArity);
    };
    // Arguments in order, before any key is touched.
    let request = parse_request(capacity, rate, Some(n))?;
    let timeout_ms = parse_timeout(timeout)?;
    let single = Single::open_request(ctx, key, request, Access::Write)?;
    let outcome = single.charge.judge(single.now_ms);
    // `retry_after_ms = -1`: n exceeds the capacity and can never be granted.
    let locked = single
        .charge
        .lock
        .is_some_and(|lock| lock.holds_at(single.now_ms));
    let would_wait = !outcome.allowed && outcome.retry_after_ms > 0 && !locked;
    if !would_wait || !blocking::may_block(ctx) || SHADOW_MODE.load(Relaxed) {
        write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
        count_decision(&outcome, request.n, key.bytes(), single.now_ms);
        return Ok(Reply::Decision(shadow(outcome)));
    }
    let (db, name) = (ctx.selected_db(), key.bytes());
    blocking::room::<Tokens>(db, name)?;
    // A denial writes nothing but a clock repair, stored before the wait.
    write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
    drop(single);

    blocking::block::<Tokens>(
        ctx,
        key,
        (db, name),
        request,
        timeout_ms,
        outcome.retry_after_ms,
    )?;
    Ok(Reply::Blocked)
}

entry_point!(pub tb_btake => btake);

// --- The kind: tokens, on the server --------------------------------------

impl GlueKind for Tokens {
    fn read(ctx: Context, key: &ServerStr, _now_ms: i64) -> Result<Served, TbError> {
        let mut bucket =
            BucketKey::open(ctx, key, Access::Read).map_err(|_| TbError::BucketGone)?;
        let bucket = bucket.read().map_err(|_| TbError::BucketGone)?;
        Ok(Served {
            bucket,
            expire_at_ms: 0,
        })
    }

    fn write(ctx: Context, key: &ServerStr, state: &Served, now_ms: i64) -> Result<(), TbError> {
        // A write follows a take, which leaves a bucket.
        let Some(after) = state.bucket else {
            return Err(TbError::Internal);
        };
        let mut bucket =
            BucketKey::open(ctx, key, Access::Write).map_err(|_| TbError::BucketGone)?;
        bucket.read().map_err(|_| TbError::BucketGone)?;
        // A lock's probation outlives the bucket's refill: keep its strikes.
        let deadline_ms = match bucket.lock() {
            Some(lock) => state.expire_at_ms.max(lock.probation_until_ms),
            None => state.expire_at_ms,
        };
        bucket.write(&after, None, now_ms, deadline_ms)
    }

    fn exists(ctx: Context, key: &ServerStr) -> bool {
        BucketKey::open(ctx, key, Access::Read).is_ok_and(|bucket| bucket.exists())
    }

    fn reply(
        ctx: Context,
        key: &[u8],
        result: Result<Outcome, TbError>,
        request: &Request,
        waited_ms: i64,
    ) {
        match result {
            Ok(outcome) if outcome.allowed => metrics::WAITS_SERVED.bump(),
            Ok(_) => metrics::WAITS_TIMED_OUT.bump(),
            Err(_) => {}
        }
        if let Ok(outcome) = result {
            count_decision(&outcome, request.n, key, ctx.wall_ms());
        }
        metrics::WAIT_MS.add(waited_ms as f64);
        send(ctx, &[], result.map(Reply::Decision));
    }

    fn waiting(count: usize) {
        metrics::WAITING.set(u64::try_from(count).unwrap_or(u64::MAX));
    }
}

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

use redis_tb_core::args::Request;
use redis_tb_core::bucket::{self, Charge, Outcome, State, TakeOptions};
use redis_tb_core::error::TbError;
use redis_tb_core::throttle::{self, from_cell, parse_tat, parse_throttle};

use super::commands::{count_decision, queued_on, shadow, Single};
use super::hash::{write_all, BucketKey, WriteFailed};
use crate::server::context::{Context, Notify};
use crate::server::keys::{Access, Key, KeyType, NotAString};
use crate::server::reply::{entry_point, Reply};
use crate::server::strings::ServerStr;

/// TB.THROTTLE key max_burst count period [quantity]
///
/// A plain TB.TAKE of `quantity` (default 1) on the bucket of capacity
/// `max_burst + 1` refilled at `count / period` per second, answered as
/// redis-cell answers: `[limited, limit, remaining, retry_after,
/// reset_after]` in whole seconds.
fn throttle_command(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let (key, max_burst, count, period, quantity) = match args {
        [_, key, max_burst, count, period] => (key, max_burst, count, period, None),
        [_, key, max_burst, count, period, quantity] => {
            (key, max_burst, count, period, Some(quantity))
        }
        _ => return Err(TbError::WrongArity),
    };
    let parsed = parse_throttle(max_burst, count, period, quantity.map(ServerStr::bytes))?;
    let request = Request {
        limit: parsed.limit,
        n: parsed.n,
    };
    let single = match Single::open_request(ctx, key, request, Access::Write) {
        // Not a hash: perhaps redis-cell's string (off the hot path).
        Err(TbError::WrongType) => return cell_key(ctx, key, request),
        other => other?,
    };
    let outcome = single.charge.judge(single.now_ms);
    write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
    Ok(answer(outcome, &request, key.bytes(), single.now_ms))
}

fn answer(outcome: Outcome, request: &Request, key: &[u8], now_ms: i64) -> Reply {
    count_decision(&outcome, request.n, key, now_ms);
    Reply::Integers(throttle::reply(&shadow(outcome), &request.limit))
}

/// TB.THROTTLE on a key that is not a hash: a string holding an integer is
/// redis-cell's TAT, judged as the bucket it stands for; anything else is
/// WRONGTYPE.
fn cell_key(ctx: Context, name: &ServerStr, request: Request) -> Result<Reply, TbError> {
    let cell = CellKey::open(ctx, name)?;
    let Some(tat_ns) = cell.tat_ns()? else {
        // Gone between the two opens (expired, on a server whose clock is
        // not cached per command): simply a missing bucket.
        drop(cell);
        let single = Single::open_request(ctx, name, request, Access::Write)?;
        let outcome = single.charge.judge(single.now_ms);
        write_all(&[(&single.bucket, &outcome)], single.now_ms)?;
        return Ok(answer(outcome, &request, name.bytes(), single.now_ms));
    };
    let now_ms = ctx.now_ms();
    let charge = Charge {
        state: Some(from_cell(tat_ns, &request.limit, now_ms)),
        limit: request.limit,
        n: request.n,
        behind: queued_on(ctx, name),
        lock: None,
        options: TakeOptions::PLAIN,
    };
    let outcome = charge.judge(now_ms);
    if let Some(state) = &outcome.write {
        cell.convert(state, &outcome, now_ms)?;
    }
    Ok(answer(outcome, &request, name.bytes(), now_ms))
}

/// A key redis-cell wrote, open for writing; closed when dropped.
struct CellKey<'a> {
    ctx: Context<'a>,
    name: &'a ServerStr,
    key: Option<Key<'a>>,
}

impl<'a> CellKey<'a> {
    /// Opens `name`, empty or a string (WRONGTYPE otherwise).
    fn open(ctx: Context<'a>, name: &'a ServerStr) -> Result<Self, TbError> {
        Ok(CellKey {
            ctx,
            name,
            key: ctx.open(name, Access::Write, KeyType::String)?,
        })
    }

    /// The TAT (Unix ns) the string holds, `None` if the key is gone; a
    /// string that is not an integer is WRONGTYPE.
    fn tat_ns(&self) -> Result<Option<i64>, TbError> {
        let key = match &self.key {
            Some(key) if !key.is_empty() => key,
            _ => return Ok(None),
        };
        let tat_ns = key.read_string(parse_tat).ok_or(TbError::Internal)?;
        tat_ns.map(Some).ok_or(TbError::WrongType)
    }

    /// Replaces the string with the bucket `state`: deleted, then the hash
    /// written with its deadline. Only once both stand are `DEL`, `HSET`
    /// and `PEXPIREAT` propagated; if the hash cannot be stored, the string
    /// is put back with its TTL and nothing is propagated.
    fn convert(self, state: &State, outcome: &Outcome, now_ms: i64) -> Result<(), TbError> {
        let (ctx, name) = (self.ctx, self.name);
        let key = self.key.as_ref().ok_or(TbError::Internal)?;
        let prior = key.string_value().map_err(|NotAString| TbError::Internal)?;
        let prior_expiry = match key.abs_expire() {
            Some(at) => Expiry::At(at),
            None => Expiry::In(key.ttl()),
        };
        let Some(prior) = prior else {
            return Err(TbError::WriteFailed);
        };
        if !key.delete() {
            return Err(TbError::WriteFailed);
        }
        drop(self);
        let mut bucket = BucketKey::open(ctx, name, Access::Write)?;
        bucket.read().map_err(|_| TbError::Internal)?;
        let deadline_ms = bucket::deadline_ms(now_ms, outcome, None);
        let applied = match bucket.apply(state, None, now_ms, deadline_ms) {
            Ok(applied) => applied,
            Err(WriteFailed) => {
                drop(bucket);
                restore(ctx, name, &prior, prior_expiry);
                return Err(TbError::WriteFailed);
            }
        };
        // The DEL goes first, so a replica or a reloaded AOF replaces the
        // string as we did.
        ctx.replicate(c"DEL", name, []);
        ctx.notify(Notify::Generic, c"del", name);
        bucket.propagate(&applied);
        Ok(())
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
fn restore(ctx: Context, name: &ServerStr, prior: &ServerStr, prior_expiry: Expiry) {
    let expire = |key: &Key| match prior_expiry {
        Expiry::At(at) | Expiry::In(at) if at < 0 => true,
        Expiry::At(at) => key.set_abs_expire(at) == Some(true),
        Expiry::In(ttl) => key.set_expire(ttl.max(1)),
    };
    let restored = match ctx.open(name, Access::Write, KeyType::String) {
        Ok(Some(key)) => key.string_set(prior) && expire(&key),
        _ => false,
    };
    if !restored {
        ctx.warn(
            "tb: could not put back a redis-cell key after a failed conversion; the key is lost on this server",
        );
    }
}

entry_point!(pub tb_throttle => throttle_command);

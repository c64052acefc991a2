//! The reply frame every command runs in: [`run`] calls a handler, catches
//! a panic, and [`send`]s what it returns ([`Reply`], or an error naming its
//! argument), counting each call for INFO tb. A handler gets the command's
//! [`Context`] and its arguments as [`ServerStr`]s, nothing raw.

use std::os::raw::{c_int, c_long};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use redis_tb_core::bucket::Outcome;
use redis_tb_core::error::{
    corrupt_bucket_message, corrupt_lease_set_message, corrupt_lock_message, TbError,
};
use redis_tb_core::top::Row;
use redis_tb_core::wait::leases::LeaseReply;

use super::api;
use super::context::Context;
use super::metrics;
use super::strings::ServerStr;

/// What a command answers: TB.TAKE's four integers
/// `[allowed, remaining, retry_after_ms, reset_after_ms]`; for TB.TAKEALL a
/// fifth, the index of the bucket those figures belong to; or nothing yet,
/// when TB.BTAKE or TB.ACQUIRE has blocked the client (blocking.rs answers
/// it later).
pub enum Reply {
    Decision(Outcome),
    All {
        outcome: Outcome,
        index: usize,
    },
    /// TB.ACQUIRE: `[acquired, available, retry_after_ms, lease]`.
    Lease(LeaseReply),
    /// TB.RELEASE, TB.RENEW, TB.UNBLOCK: 1 or 0.
    Flag(bool),
    /// TB.THROTTLE: redis-cell's five integers.
    Integers([i64; 5]),
    Blocked,
    /// TB.TOP: `[key, count, error, shadow, truncated]` rows.
    Top(Vec<Row>),
    /// TB.TOP RESET: `OK`.
    Ok,
    /// Nothing to send: the server asked TB.TAKEALL for its keys only
    /// (`getkeys-api`), and was told through `RM_KeyAtPos`.
    KeysNamed,
}

/// The argument index of the key in every single-key command.
pub const KEY_ARG: usize = 1;

/// A command's handler: the command's context and its arguments (the
/// command's name first), both good for the call only.
pub type Handler = fn(Context<'_>, &[ServerStr]) -> Result<Reply, TbError>;

/// Runs a handler and sends its reply. A panic (a bug: no input should cause
/// one) would abort the whole server if it crossed this `extern "C"`
/// boundary, so it is caught here, logged by the panic hook, and answered
/// with an error instead.
pub fn run(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let Some(api) = api::api() else {
        return raw::REDISMODULE_ERR as c_int;
    };
    let args: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: the server passes argc valid string pointers in argv.
        Ok(len) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, len) },
        _ => &[],
    };
    // SAFETY: the command's context and its arguments, live until it
    // returns; the handler cannot keep either past this call.
    let (ctx, args) = unsafe { (Context::new(api, ctx), ServerStr::slice(args)) };
    let result =
        catch_unwind(AssertUnwindSafe(|| handler(ctx, args))).unwrap_or(Err(TbError::Internal));
    send(ctx, args, result);
    raw::REDISMODULE_OK as c_int
}

/// The `extern "C"` entry point the command table registers for a
/// handler: `entry_point!(pub tb_take => take);` defines `tb_take`, which
/// runs `take` in the reply frame (`run`).
macro_rules! entry_point {
    ($vis:vis $name:ident => $handler:path) => {
        $vis extern "C" fn $name(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::server::reply::run(ctx, argv, argc, $handler)
        }
    };
}
pub(crate) use entry_point;

/// Sends a reply (or an error naming its argument from `args`) on `ctx`,
/// and counts it: a reply is a call, an error an error.
pub fn send(context: Context, args: &[ServerStr], result: Result<Reply, TbError>) {
    match &result {
        Ok(Reply::Blocked | Reply::KeysNamed) => return,
        // TB.TOP reads what the module counted; it decides nothing.
        Ok(Reply::Top(_) | Reply::Ok) => {}
        Ok(_) => metrics::CALLS.bump(),
        Err(_) => metrics::ERRORS.bump(),
    }
    let (api, ctx) = (context.api(), context.ptr());
    // SAFETY: replying on a context that has a client (a command's, or a
    // blocked client's callback).
    unsafe {
        match result {
            Ok(Reply::Blocked | Reply::KeysNamed) => {}
            Ok(Reply::Decision(outcome)) => reply_outcome(api, ctx, &outcome, None),
            Ok(Reply::All { outcome, index }) => {
                let index = i64::try_from(index).unwrap_or(i64::MAX);
                reply_outcome(api, ctx, &outcome, Some(index));
            }
            Ok(Reply::Lease(lease)) => reply_lease(api, ctx, &lease),
            Ok(Reply::Top(rows)) => reply_top(api, ctx, &rows),
            Ok(Reply::Ok) => {
                (api.reply_with_simple_string)(ctx, c"OK".as_ptr());
            }
            Ok(Reply::Flag(flag)) => {
                (api.reply_with_long_long)(ctx, i64::from(flag));
            }
            Ok(Reply::Integers(values)) => {
                (api.reply_with_array)(ctx, values.len() as c_long);
                for value in values {
                    (api.reply_with_long_long)(ctx, value);
                }
            }
            Err(TbError::WrongArity) => {
                (api.wrong_arity)(ctx);
            }
            Err(TbError::CorruptLeaseSet { key_arg }) => {
                let key = args.get(key_arg).map(ServerStr::bytes).unwrap_or_default();
                let message = corrupt_lease_set_message(key);
                (api.reply_with_error)(ctx, message.as_ptr());
            }
            Err(TbError::CorruptBucket { key_arg }) => {
                let key = args.get(key_arg).map(ServerStr::bytes).unwrap_or_default();
                let message = corrupt_bucket_message(key);
                (api.reply_with_error)(ctx, message.as_ptr());
            }
            Err(TbError::CorruptLock { key_arg }) => {
                let key = args.get(key_arg).map(ServerStr::bytes).unwrap_or_default();
                let message = corrupt_lock_message(key);
                (api.reply_with_error)(ctx, message.as_ptr());
            }
            Err(error) => {
                (api.reply_with_error)(ctx, error.message().as_ptr());
            }
        }
    }
}

/// `[allowed, remaining, retry_after_ms, reset_after_ms]`, and the deciding
/// bucket's index for TB.TAKEALL.
///
/// # Safety
/// `ctx` must be a context with a client.
unsafe fn reply_outcome(
    api: &api::Api,
    ctx: *mut RedisModuleCtx,
    outcome: &Outcome,
    index: Option<i64>,
) {
    (api.reply_with_array)(ctx, if index.is_some() { 5 } else { 4 } as c_long);
    (api.reply_with_long_long)(ctx, i64::from(outcome.allowed));
    (api.reply_with_long_long)(ctx, outcome.remaining);
    (api.reply_with_long_long)(ctx, outcome.retry_after_ms);
    (api.reply_with_long_long)(ctx, outcome.reset_after_ms);
    if let Some(index) = index {
        (api.reply_with_long_long)(ctx, index);
    }
}

/// `[acquired, available, retry_after_ms, lease]`, the lease a bulk string
/// or nil.
///
/// # Safety
/// `ctx` must be a context with a client.
unsafe fn reply_lease(api: &api::Api, ctx: *mut RedisModuleCtx, lease: &LeaseReply) {
    (api.reply_with_array)(ctx, 4);
    (api.reply_with_long_long)(ctx, i64::from(lease.id.is_some()));
    (api.reply_with_long_long)(ctx, lease.available);
    (api.reply_with_long_long)(ctx, lease.retry_after_ms);
    match lease.id {
        Some(id) => {
            let text = id.text();
            let bytes = text.as_bytes();
            (api.reply_with_string_buffer)(ctx, bytes.as_ptr().cast(), bytes.len());
        }
        None => {
            (api.reply_with_null)(ctx);
        }
    }
}

/// TB.TOP's rows: `[key, count, error, shadow, truncated]`, the key a bulk
/// string of its (cut) bytes.
///
/// # Safety
/// `ctx` must be a context with a client.
unsafe fn reply_top(api: &api::Api, ctx: *mut RedisModuleCtx, rows: &[Row]) {
    let as_integer = |count: u64| i64::try_from(count).unwrap_or(i64::MAX);
    (api.reply_with_array)(ctx, c_long::try_from(rows.len()).unwrap_or(0));
    for row in rows {
        (api.reply_with_array)(ctx, 5);
        (api.reply_with_string_buffer)(ctx, row.key.as_ptr().cast(), row.key.len());
        (api.reply_with_long_long)(ctx, as_integer(row.count));
        (api.reply_with_long_long)(ctx, as_integer(row.error));
        (api.reply_with_long_long)(ctx, as_integer(row.shadow));
        (api.reply_with_long_long)(ctx, i64::from(row.truncated));
    }
}

//! redis-tb: a token-bucket rate limiter inside Redis and Valkey.
//!
//! `TB.TAKE key capacity rate n` refills, caps and takes in one step. Redis
//! runs a module command to completion on its single command thread, so no
//! other client can read or write the bucket between the read and the write:
//! the same atomicity a Lua script gets, without a script cache, a NOSCRIPT
//! fallback or a clock supplied by the client.
//!
//! Layout: `bucket.rs` is the arithmetic (pure), `args.rs`/`number.rs` parse
//! input, `store.rs` reads and writes the hash, `command_info.rs` registers
//! the commands; this file holds the two handlers and the load hook.

#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

mod api;
mod args;
pub mod bucket;
mod command_info;
mod error;
mod fault;
mod metrics;
pub mod number;
mod store;

use std::collections::HashSet;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_long, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_module::commands::KeySpecFlags;
use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::api::Api;
use crate::args::parse_request;
use crate::bucket::{Charge, Outcome};
use crate::command_info::{CommandSpec, Shape};
use crate::error::{corrupt_bucket_message, TbError};
use crate::store::{Access, BucketKey, Corrupt, Expiry, WriteFailed};

/// What a command replies: TB.TAKE's four integers
/// `[allowed, remaining, retry_after_ms, reset_after_ms]`, and for
/// TB.TAKEALL a fifth, the index of the bucket those figures belong to.
struct Reply {
    outcome: Outcome,
    bucket_index: Option<usize>,
}

impl From<Outcome> for Reply {
    fn from(outcome: Outcome) -> Self {
        Reply {
            outcome,
            bucket_index: None,
        }
    }
}

/// The argument index of the key in TB.TAKE, TB.PEEK and TB.REFUND.
const KEY_ARG: usize = 1;

/// TB.TAKE key capacity rate n
///
/// Refill by elapsed time, cap at capacity, take n if there are that many.
fn take(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let single = Single::open(api, ctx, args, Access::Write)?;
    let outcome = bucket::take(
        single.state,
        &single.request.limit,
        single.request.n,
        single.now_ms,
    );
    store(&[single.change(&outcome)], single.now_ms)?;
    count_decision(outcome.allowed, single.request.n);
    Ok(shadow(outcome).into())
}

/// TB.PEEK key capacity rate [n]
///
/// The reply TB.TAKE would give, without taking or writing anything, so it
/// is read-only and runs on replicas. A `last_refill` in the future is
/// answered as if repaired, though only a write command stores the repair.
fn peek(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let single = Single::open(api, ctx, args, Access::Read)?;
    Ok(bucket::take(
        single.state,
        &single.request.limit,
        single.request.n,
        single.now_ms,
    )
    .into())
}

/// TB.REFUND key capacity rate n
///
/// Gives n tokens back (refill first, then add, capped at capacity), for a
/// request that failed for the caller's own reasons.
fn refund(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let single = Single::open(api, ctx, args, Access::Write)?;
    let refunded = bucket::refund(
        single.state,
        &single.request.limit,
        single.request.n,
        single.now_ms,
    );
    store(&[single.change(&refunded.outcome)], single.now_ms)?;
    metrics::TOKENS_REFUNDED.add(refunded.added);
    Ok(refunded.outcome.into())
}

/// One bucket named by `key capacity rate n` (n optional for reads, as in
/// TB.PEEK), parsed, opened, read, and the instant it is judged at.
struct Single<'a> {
    bucket: BucketKey<'a>,
    request: args::Request,
    state: Option<bucket::State>,
    now_ms: i64,
}

impl<'a> Single<'a> {
    fn open(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        args: &[*mut RedisModuleString],
        access: Access,
    ) -> Result<Self, TbError> {
        let (key, capacity, rate, n) = match (args, access) {
            (&[_, key, capacity, rate, n], _) => (key, capacity, rate, Some(n)),
            (&[_, key, capacity, rate], Access::Read) => (key, capacity, rate, None),
            _ => return Err(TbError::WrongArity),
        };
        // SAFETY: argv strings live for the whole command.
        let request = unsafe {
            parse_request(
                api.bytes(capacity),
                api.bytes(rate),
                n.map(|n| api.bytes(n)),
            )
        }?;
        // SAFETY: ctx and key come straight from the server for this command.
        let mut bucket = unsafe { BucketKey::open(api, ctx, key, access) }?;
        let state = read(&mut bucket, KEY_ARG)?;
        // The clock is read once; the refill, the reply and the deadline all
        // use this instant.
        Ok(Single {
            bucket,
            request,
            state,
            now_ms: now(api),
        })
    }

    fn change<'s>(&'s self, outcome: &Outcome) -> Change<'s, 'a> {
        Change {
            bucket: &self.bucket,
            was_missing: self.state.is_none(),
            outcome: *outcome,
        }
    }
}

/// TB.TAKEALL key capacity rate n [key capacity rate n ...]
///
/// Several limits on one request, all or nothing. Every argument is parsed,
/// and every key type-checked and read, before anything is written, so an
/// error or a denial leaves every bucket as it was (bar clock repairs, see
/// `bucket::seen_at`). The server runs the whole command at once, so no
/// client sees some buckets charged and others not; the replicated
/// HSET/PEXPIREAT pairs arrive in one MULTI/EXEC.
fn take_all(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
    let groups = args.get(1..).unwrap_or_default();
    if groups.is_empty() || groups.len() % 4 != 0 {
        return Err(TbError::WrongArity);
    }
    let count = groups.len() / 4;
    let mut keys = Vec::with_capacity(count);
    let mut requests = Vec::with_capacity(count);
    for group in groups.chunks_exact(4) {
        let &[key, capacity, rate, n] = group else {
            return Err(TbError::WrongArity);
        };
        // SAFETY: as in `Single::open`.
        requests.push(unsafe {
            parse_request(api.bytes(capacity), api.bytes(rate), Some(api.bytes(n)))
        }?);
        keys.push(key);
    }
    // Hashing keeps the whole command linear in the number of keys: it runs
    // on the server's only command thread, and a quadratic check made one
    // call with 20,000 keys stall every client for more than a second.
    let mut seen = HashSet::with_capacity(count);
    // SAFETY: as in `Single::open`.
    if !keys
        .iter()
        .all(|key| seen.insert(unsafe { api.bytes(*key) }))
    {
        return Err(TbError::DuplicateKey);
    }
    drop(seen);
    let mut buckets = Vec::with_capacity(count);
    let mut charges = Vec::with_capacity(count);
    for (index, (key, request)) in keys.iter().zip(&requests).enumerate() {
        // SAFETY: as in `Single::open`.
        let mut bucket = unsafe { BucketKey::open(api, ctx, *key, Access::Write) }?;
        charges.push(Charge {
            state: read(&mut bucket, index.saturating_mul(4).saturating_add(KEY_ARG))?,
            limit: request.limit,
            n: request.n,
        });
        buckets.push(bucket);
    }
    let now_ms = now(api);
    let result = bucket::take_all(&charges, now_ms);
    let changes: Vec<Change> = buckets
        .iter()
        .zip(&result.outcomes)
        .zip(&charges)
        .map(|((bucket, outcome), charge)| Change {
            bucket,
            was_missing: charge.state.is_none(),
            outcome: *outcome,
        })
        .collect();
    store(&changes, now_ms)?;
    let decisive = result
        .outcomes
        .get(result.decisive)
        .copied()
        .ok_or(TbError::Internal)?;
    let outcome = Outcome {
        allowed: result.allowed,
        ..decisive
    };
    count_decision(outcome.allowed, charges.iter().map(|charge| charge.n).sum());
    Ok(Reply {
        outcome: shadow(outcome),
        bucket_index: Some(result.decisive),
    })
}

fn read(bucket: &mut BucketKey, key_arg: usize) -> Result<Option<bucket::State>, TbError> {
    bucket
        .read()
        .map_err(|Corrupt| TbError::CorruptBucket { key_arg })
}

/// One bucket's outcome, to be stored if it writes.
struct Change<'s, 'a> {
    bucket: &'s BucketKey<'a>,
    was_missing: bool,
    outcome: Outcome,
}

/// Stores every outcome that writes, all or none.
///
/// Every write is first applied to the keyspace only; if the server
/// refuses one, those already applied are taken back, nothing is
/// propagated and the command fails, so no replica, AOF or watcher can see
/// what the master does not hold. Only then is each write propagated.
fn store(changes: &[Change], now_ms: i64) -> Result<(), TbError> {
    let writes = changes
        .iter()
        .filter(|change| change.outcome.write.is_some())
        .count();
    // What to put back if a later write fails; a lone write needs none.
    let expiries: Vec<Expiry> = if writes > 1 {
        changes
            .iter()
            .map(|change| change.bucket.expiry())
            .collect()
    } else {
        Vec::new()
    };
    let mut applied = Vec::with_capacity(writes);
    for (index, change) in changes.iter().enumerate() {
        let Some(state) = change.outcome.write else {
            continue;
        };
        let deadline_ms = bucket::expire_at_ms(now_ms, change.outcome.reset_after_ms);
        match change.bucket.apply(&state, now_ms, deadline_ms) {
            Ok(done) => applied.push((index, done)),
            Err(WriteFailed) => {
                for (index, done) in applied.into_iter().rev() {
                    if let Some(change) = changes.get(index) {
                        let expiry = expiries.get(index).copied().unwrap_or(Expiry::Unknown);
                        change.bucket.rollback(done, expiry);
                    }
                }
                return Err(TbError::WriteFailed);
            }
        }
    }
    for (index, done) in &applied {
        if let Some(change) = changes.get(*index) {
            change.bucket.propagate(done);
            if change.was_missing {
                metrics::BUCKETS_CREATED.bump();
            }
        }
    }
    Ok(())
}

/// Counts a TB.TAKE / TB.TAKEALL decision for `INFO tb`.
fn count_decision(allowed: bool, n: f64) {
    if allowed {
        metrics::ALLOWED.bump();
        metrics::TOKENS_GRANTED.add(n);
    } else {
        metrics::DENIED.bump();
    }
}

/// With `tb.shadow-mode yes`, a denial is reported as allowed (and counted
/// as `shadow_denied`) so a new limit can be watched in production before it
/// is enforced. Nothing is written for it: the bucket holds only what was
/// really taken, and retry_after_ms still says how long the caller would
/// have had to wait.
fn shadow(outcome: Outcome) -> Outcome {
    if outcome.allowed || !SHADOW_MODE.load(Relaxed) {
        return outcome;
    }
    metrics::SHADOW_DENIED.bump();
    Outcome {
        allowed: true,
        ..outcome
    }
}

fn now(api: &Api) -> i64 {
    api.now_ms()
}

type Handler = fn(&Api, *mut RedisModuleCtx, &[*mut RedisModuleString]) -> Result<Reply, TbError>;

/// Runs a handler and sends its reply. A panic (a bug: no input should cause
/// one) would abort the whole server if it crossed this `extern "C"`
/// boundary, so it is caught here, logged by the panic hook, and answered
/// with an error instead.
fn run(
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
    let result = catch_unwind(AssertUnwindSafe(|| handler(api, ctx, args)));
    match &result {
        Ok(Ok(_)) => metrics::CALLS.bump(),
        _ => metrics::ERRORS.bump(),
    }
    // SAFETY: replying on the command's own context.
    unsafe {
        match result {
            Ok(Ok(Reply {
                outcome,
                bucket_index,
            })) => {
                let index = bucket_index.map(|index| i64::try_from(index).unwrap_or(i64::MAX));
                (api.reply_with_array)(ctx, if index.is_some() { 5 } else { 4 } as c_long);
                (api.reply_with_long_long)(ctx, i64::from(outcome.allowed));
                (api.reply_with_long_long)(ctx, outcome.remaining);
                (api.reply_with_long_long)(ctx, outcome.retry_after_ms);
                (api.reply_with_long_long)(ctx, outcome.reset_after_ms);
                if let Some(index) = index {
                    (api.reply_with_long_long)(ctx, index);
                }
            }
            Ok(Err(TbError::WrongArity)) => {
                (api.wrong_arity)(ctx);
            }
            Ok(Err(TbError::CorruptBucket { key_arg })) => {
                let key = args
                    .get(key_arg)
                    .map(|key| api.bytes(*key))
                    .unwrap_or_default();
                let message = corrupt_bucket_message(key);
                (api.reply_with_error)(ctx, message.as_ptr());
            }
            Ok(Err(error)) => {
                (api.reply_with_error)(ctx, error.message().as_ptr());
            }
            Err(_) => {
                (api.reply_with_error)(ctx, TbError::Internal.message().as_ptr());
            }
        }
    }
    raw::REDISMODULE_OK as c_int
}

extern "C" fn tb_take(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, take)
}

extern "C" fn tb_peek(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, peek)
}

extern "C" fn tb_refund(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, refund)
}

extern "C" fn tb_takeall(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, take_all)
}

const COMMANDS: [CommandSpec; 4] = [
    CommandSpec {
        name: c"tb.take",
        handler: Some(tb_take),
        flags: c"write deny-oom fast",
        acl_categories: c"write fast",
        summary: c"Takes n tokens from a token bucket if it holds that many. Replies [allowed, remaining, retry_after_ms, reset_after_ms].",
        complexity: c"O(1)",
        arity: 5,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Single { n_optional: false },
    },
    CommandSpec {
        name: c"tb.peek",
        handler: Some(tb_peek),
        flags: c"readonly fast",
        acl_categories: c"read fast",
        summary: c"Replies what TB.TAKE would for n tokens (default 1), without taking or writing anything.",
        complexity: c"O(1)",
        arity: -4,
        key_flags: KeySpecFlags::READ_ONLY.union(KeySpecFlags::ACCESS),
        shape: Shape::Single { n_optional: true },
    },
    CommandSpec {
        name: c"tb.refund",
        handler: Some(tb_refund),
        flags: c"write deny-oom fast",
        acl_categories: c"write fast",
        summary: c"Gives n tokens back to a bucket, capped at capacity. Replies like TB.TAKE.",
        complexity: c"O(1)",
        arity: 5,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Single { n_optional: false },
    },
    CommandSpec {
        name: c"tb.takeall",
        handler: Some(tb_takeall),
        // Not `fast`: its cost grows with the number of buckets, like MSET.
        flags: c"write deny-oom",
        acl_categories: c"write slow",
        summary: c"Takes from every bucket if all hold enough, else from none. Replies [allowed, remaining, retry_after_ms, reset_after_ms, index] for the deciding bucket.",
        complexity: c"O(N) where N is the number of buckets",
        arity: -5,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Repeated,
    },
];

const READ_WRITE_UPDATE: KeySpecFlags = KeySpecFlags::READ_WRITE
    .union(KeySpecFlags::ACCESS)
    .union(KeySpecFlags::UPDATE);

/// The server's entry point on `loadmodule` / `MODULE LOAD`.
///
/// Written out rather than generated by the crate's `redis_module!` macro:
/// the macro's version keeps a detached context (~17.6 KB) and the config's
/// private data for the crate's own use and never frees them, so every load
/// leaked them. What this one keeps past an unload is the two field-name
/// strings (`api.rs`, about 60 bytes): freeing them on unload would be
/// unsafe wherever the dynamic loader keeps the library, and with it the
/// pointers to them, mapped across a reload.
///
/// # Safety
/// Called by the server, once per load, on its main thread.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    // Nothing may allocate before this: the global allocator is the
    // server's, reached through the functions Init fills in.
    let init = raw::Export_RedisModule_Init(
        ctx,
        c"tb".as_ptr(),
        MODULE_VERSION,
        raw::REDISMODULE_APIVER_1 as c_int,
    );
    if init == raw::REDISMODULE_ERR as c_int {
        return raw::REDISMODULE_ERR as c_int;
    }
    let loaded = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the server hands over argc valid strings.
        let args = unsafe { load_args(argv, argc) };
        let shadow_mode = check_load_args(args.iter().copied())?;
        // SAFETY: OnLoad context, after Init.
        unsafe { register_config(ctx, shadow_mode) }?;
        load(ctx)
    }));
    let failure = match loaded {
        Ok(Ok(())) => return raw::REDISMODULE_OK as c_int,
        Ok(Err(why)) => why,
        Err(_) => "panic during load".to_owned(),
    };
    // SAFETY: set by Init (checked above), read-only afterwards.
    if let Some(log) = unsafe { raw::RedisModule_Log } {
        api::write_log(log, ctx, c"warning", &format!("tb: not loaded: {failure}"));
    }
    raw::REDISMODULE_ERR as c_int
}

/// The module version `MODULE LIST` shows.
const MODULE_VERSION: c_int = 1;

/// The load arguments as bytes, borrowed from the server.
///
/// # Safety
/// `argv` must hold `argc` valid strings that outlive the result.
unsafe fn load_args<'a>(argv: *mut *mut RedisModuleString, argc: c_int) -> Vec<&'a [u8]> {
    let count = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() || count == 0 {
        return Vec::new();
    }
    let Some(string_ptr_len) = raw::RedisModule_StringPtrLen else {
        return Vec::new();
    };
    std::slice::from_raw_parts(argv, count)
        .iter()
        .map(|&arg| {
            let mut len = 0usize;
            let ptr = string_ptr_len(arg, &mut len);
            if ptr.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(ptr.cast::<u8>(), len)
            }
        })
        .collect()
}

/// Registers the `tb.shadow-mode` config (`CONFIG GET/SET`, redis.conf),
/// starting at the value the load arguments gave, then lets the server
/// apply what its config file says.
///
/// # Safety
/// OnLoad context, after Init.
unsafe fn register_config(ctx: *mut RedisModuleCtx, shadow_mode: bool) -> Result<(), String> {
    SHADOW_MODE.store(shadow_mode, Relaxed);
    let Some(register_bool) = raw::RedisModule_RegisterBoolConfig else {
        return Ok(()); // before 7.0: the load argument alone sets it
    };
    let status = register_bool(
        ctx,
        c"shadow-mode".as_ptr(),
        c_int::from(shadow_mode),
        raw::REDISMODULE_CONFIG_DEFAULT,
        Some(get_shadow_mode),
        Some(set_shadow_mode),
        None,
        std::ptr::null_mut(),
    );
    if status != raw::REDISMODULE_OK as c_int {
        return Err("could not register the config tb.shadow-mode".into());
    }
    if let Some(load_configs) = raw::RedisModule_LoadConfigs {
        if load_configs(ctx) != raw::REDISMODULE_OK as c_int {
            return Err("the server refused the value of tb.shadow-mode".into());
        }
    }
    Ok(())
}

extern "C" fn get_shadow_mode(_name: *const c_char, _privdata: *mut c_void) -> c_int {
    c_int::from(SHADOW_MODE.load(Relaxed))
}

extern "C" fn set_shadow_mode(
    _name: *const c_char,
    value: c_int,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    SHADOW_MODE.store(value != 0, Relaxed);
    raw::REDISMODULE_OK as c_int
}

/// Load arguments are `name value` pairs of module configs; the only one is
/// `shadow-mode yes|no`, whose value (default no) this returns. Anything
/// else is refused rather than ignored, so a typo in `loadmodule` fails
/// loudly instead of silently running defaults.
fn check_load_args<'a>(mut args: impl Iterator<Item = &'a [u8]>) -> Result<bool, String> {
    let mut shadow_mode = false;
    while let Some(name) = args.next() {
        #[cfg(feature = "fault-injection")]
        if name == b"fault" {
            let step = args.next().unwrap_or_default();
            fault::arm(step, args.next().unwrap_or_default())?;
            continue;
        }
        if name != b"shadow-mode" {
            let name = String::from_utf8_lossy(name);
            return Err(format!(
                "unknown load argument '{name}' (known: shadow-mode yes|no)"
            ));
        }
        shadow_mode = match args.next() {
            Some(b"yes") => true,
            Some(b"no") => false,
            _ => return Err("shadow-mode must be followed by yes or no".into()),
        };
    }
    Ok(shadow_mode)
}

fn load(ctx: *mut RedisModuleCtx) -> Result<(), String> {
    // SAFETY: called from OnLoad, after RedisModule_Init.
    let api =
        unsafe { api::resolve() }.map_err(|missing| format!("this server lacks {missing}"))?;
    std::panic::set_hook(Box::new(|info| {
        if let Some(api) = api::api() {
            api.log(
                std::ptr::null_mut(),
                c"warning",
                &format!("tb: bug: {info}"),
            );
        }
    }));
    set_module_options(ctx);
    // SAFETY: OnLoad context. This replaces the crate's default INFO callback.
    if let Some(register_info) = unsafe { raw::RedisModule_RegisterInfoFunc } {
        unsafe { register_info(ctx, Some(metrics::info)) };
    }
    // Our own ACL category `@tb` (Redis 7.4+, Valkey 8+), so one rule such as
    // `+@tb` grants every TB command.
    // SAFETY: OnLoad context, before any command is created.
    let module_category = match unsafe { raw::RedisModule_AddACLCategory } {
        Some(add_category) => {
            let status = unsafe { add_category(ctx, c"tb".as_ptr()) };
            status == raw::REDISMODULE_OK as c_int
        }
        None => false,
    };
    for spec in &COMMANDS {
        // SAFETY: OnLoad context.
        unsafe { command_info::register(ctx, spec, module_category) }?;
    }
    if api.set_abs_expire.is_none() {
        api.log(
            ctx,
            c"notice",
            "tb: RM_SetAbsExpire missing (Redis < 7.0.5): deadlines are set relative to the local clock",
        );
    }
    Ok(())
}

/// Valkey's option that lets `CLUSTER MIGRATESLOTS` move keys of a module
/// that does not need to react to it (our buckets are plain hashes).
const VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

fn set_module_options(ctx: *mut RedisModuleCtx) {
    // WATCH/tracking are signalled by `store.rs` only when a bucket is
    // written; by default every write-open would signal, even for a denied
    // request that changes nothing.
    let mut options = raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int;
    if valkey_major(ctx).is_some_and(|major| major >= 9) {
        options |= VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    // SAFETY: OnLoad context.
    if let Some(set_options) = unsafe { raw::RedisModule_SetModuleOptions } {
        unsafe { set_options(ctx, options) };
    }
}

/// Valkey's major version, or `None` on Redis (which has no `server_name`).
fn valkey_major(ctx: *mut RedisModuleCtx) -> Option<u32> {
    // SAFETY: OnLoad context; the info data is freed before returning and
    // the field pointers are not used after that.
    unsafe {
        let get_info = raw::RedisModule_GetServerInfo?;
        let get_field = raw::RedisModule_ServerInfoGetFieldC?;
        let free_info = raw::RedisModule_FreeServerInfo?;
        let info = get_info(ctx, c"server".as_ptr());
        if info.is_null() {
            return None;
        }
        let field = |name: &CStr| {
            let value = get_field(info, name.as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
        };
        let is_valkey = field(c"server_name").is_some_and(|name| name == "valkey");
        let version = field(c"valkey_version");
        free_info(ctx, info);
        if !is_valkey {
            return None;
        }
        version?.split('.').next()?.parse().ok()
    }
}

// Unit tests run outside a server, where the server's allocator does not
// exist; they use the system allocator instead.
#[cfg(not(test))]
type ModuleAlloc = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type ModuleAlloc = std::alloc::System;

/// `tb.shadow-mode`: report denials as allowed (see `shadow`).
static SHADOW_MODE: AtomicBool = AtomicBool::new(false);

/// Every heap allocation of the module goes through the server's allocator,
/// so `INFO memory` and `MEMORY` commands account for it.
#[global_allocator]
static ALLOCATOR: ModuleAlloc = ModuleAlloc {};

//! TB.BTAKE key capacity rate n timeout_ms: wait in the server, first come
//! first served, until the bucket holds n.
//!
//! How a wait works:
//! - The client is blocked with `RM_BlockClientOnKeys` on its key, so the
//!   server itself answers it when it must stop waiting for reasons of its
//!   own: its timeout (our `on_unblocked` callback replies a denial), a slot
//!   that moved away in a cluster (MOVED/ASK), the master turning into a
//!   replica (-UNBLOCKED), a disconnect, CLIENT KILL or CLIENT UNBLOCK.
//! - Who waits on which key, in which order, is ours (`wait.rs`): the server
//!   would offer a key to every waiter in turn, O(waiters) per wake-up, and
//!   does not serve module waiters on a key that does not exist (a deleted
//!   or expired bucket, which is a full one).
//! - One timer per key with waiters is set for the instant its head can be
//!   served, computed by the same arithmetic as `retry_after_ms`. When it
//!   fires (`drive`), the head is served if the bucket holds its n; any
//!   write to the key (a TB.REFUND, a hand-written HSET, a DEL, an expiry)
//!   brings that timer forward to now, through the keyspace events.
//! - Serving unblocks the client explicitly; the take itself happens in the
//!   server's callback for that client (`on_unblocked`), with the clock of
//!   that moment, so a client that is gone by then takes nothing. Redis 7.0
//!   and Valkey run that callback at once, Redis 7.2+ just before the event
//!   loop sleeps; either way the next waiter is only considered afterwards,
//!   so nobody overtakes.
//! - Everything here runs on the server's main thread.

use std::cell::UnsafeCell;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

use redis_module::raw::{
    RedisModuleBlockedClient, RedisModuleCtx, RedisModuleEvent, RedisModuleString,
    RedisModule_SubscribeToKeyspaceEvents, REDISMODULE_CTX_FLAGS_CLUSTER,
    REDISMODULE_CTX_FLAGS_DENY_BLOCKING, REDISMODULE_CTX_FLAGS_LUA, REDISMODULE_CTX_FLAGS_MULTI,
    REDISMODULE_ERR, REDISMODULE_NOTIFY_ALL, REDISMODULE_OK,
};

use crate::api::{self, Api};
use crate::args::{parse_request, parse_timeout};
use crate::bucket::{self, Outcome};
use crate::commands::{
    count_decision, read, send, shadow, store, Answer, Change, Single, KEY_ARG, SHADOW_MODE,
};
use crate::error::TbError;
use crate::metrics;
use crate::store::{Access, BucketKey};
use crate::wait::{KeyName, Queues, WaitState, Waiter};

/// `tb.max-waiters`: how many clients may wait on one key.
pub const DEFAULT_MAX_WAITERS: i64 = 10_000;
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);

/// The longest single timer; a longer wait is re-checked when it fires.
const MAX_TIMER_MS: i64 = 1 << 30;

/// TB.BTAKE key capacity rate n timeout_ms
///
/// Exactly TB.TAKE when it can be granted at once (or may not wait: inside
/// MULTI, a script, or where the server forbids blocking; or in shadow
/// mode); otherwise the client waits behind those already waiting on the
/// key.
pub fn btake(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Answer, TbError> {
    let [_, key, capacity, rate, n, timeout] = args else {
        return Err(TbError::WrongArity);
    };
    let key = *key;
    // Arguments in order, before any key is touched.
    // SAFETY: argv strings live for the whole command.
    let request =
        unsafe { parse_request(api.bytes(capacity), api.bytes(rate), Some(api.bytes(n))) }?;
    let timeout_ms = parse_timeout(unsafe { api.bytes(timeout) })?;
    let single = Single::open_request(api, ctx, key, request, Access::Write)?;
    let charge = single.charge;
    let now_ms = single.now_ms;
    let outcome = charge.judge(now_ms);
    // `retry_after_ms = -1`: n exceeds the capacity and can never be granted.
    let would_wait = !outcome.allowed && outcome.retry_after_ms > 0;
    if !would_wait || !may_block(api, ctx) || SHADOW_MODE.load(Relaxed) {
        store(&[single.change(&outcome)], now_ms)?;
        count_decision(outcome.allowed, charge.n);
        return Ok(shadow(outcome).into());
    }
    let name = key_name(api, ctx, key);
    let waiting = with_queues(|queues| queues.ahead(&name).map_or(0, |(count, _)| count))
        .ok_or(TbError::Internal)?;
    if i64::try_from(waiting).unwrap_or(i64::MAX) >= MAX_WAITERS.load(Relaxed) {
        return Err(TbError::TooManyWaiters);
    }
    // A denial writes nothing but a clock repair, stored before the wait.
    store(&[single.change(&outcome)], now_ms)?;
    drop(single);

    let waiter = Waiter {
        key: name.clone(),
        limit: charge.limit,
        n: charge.n,
        since_ms: api.wall_ms(),
        handle: 0,
        deadline_timer: None,
        state: WaitState::Waiting,
    };
    listen_to_keyspace(ctx);
    let (id, is_head) = with_queues(|queues| queues.push(waiter)).ok_or(TbError::Internal)?;
    let mut keys = [key];
    // No timeout for the server to enforce: it checks blocked clients'
    // timeouts only a few times a second (up to ~100 ms late), so the
    // module ends the wait with a timer of its own (`on_deadline`), to the ms.
    // SAFETY: the command's context and key; the id travels as the private
    // data (never dereferenced: it is a number).
    let handle = unsafe {
        (api.block_client_on_keys)(
            ctx,
            Some(on_ready),
            Some(on_unblocked),
            Some(on_free),
            0,
            keys.as_mut_ptr(),
            1,
            id as usize as *mut c_void,
        )
    };
    if handle.is_null() {
        with_queues(|queues| queues.remove(id));
        return Err(TbError::Internal);
    }
    let deadline_timer = (timeout_ms > 0).then(|| {
        // SAFETY: a live context; the data is the waiter's id, a number.
        unsafe {
            (api.create_timer)(
                ctx,
                timeout_ms,
                Some(on_deadline),
                id as usize as *mut c_void,
            )
        }
    });
    with_queues(|queues| queues.set_handle(id, handle as usize, deadline_timer));
    // SAFETY: a handle the server just gave out.
    unsafe { (api.set_disconnect_callback)(handle, Some(on_disconnect)) };
    metrics::WAITS_STARTED.bump();
    if is_head {
        schedule(api, ctx, &name, outcome.retry_after_ms);
    }
    Ok(Answer::Waiting)
}

/// The tokens TB.BTAKE callers waiting on `key` want, if any wait: the
/// other commands leave those tokens to the queue (`bucket::take_behind`).
pub fn queued_on(api: &Api, ctx: *mut RedisModuleCtx, key: *mut RedisModuleString) -> Option<f64> {
    with_queues(|queues| {
        if queues.is_empty() {
            return None; // the usual case: no lookup at all
        }
        queues
            .ahead(&key_name(api, ctx, key))
            .map(|(_, wanted)| wanted)
    })
    .flatten()
}

/// Clients waiting now, for `INFO tb`.
pub fn waiting() -> usize {
    with_queues(|queues| queues.waiting()).unwrap_or(0)
}

/// Subscribes `on_keyspace_event` to every keyspace event, on the first
/// wait ever. Not at load: the server creates a context for each event it
/// hands a module, a cost every TB.TAKE (two events per write) and every
/// other write would pay on a server that never waits. There is no way to
/// unsubscribe, so it stays once made.
fn listen_to_keyspace(ctx: *mut RedisModuleCtx) {
    if SUBSCRIBED.swap(true, Relaxed) {
        return;
    }
    // SAFETY: a command's context; the pointer was set by RedisModule_Init.
    if let Some(subscribe) = unsafe { RedisModule_SubscribeToKeyspaceEvents } {
        unsafe { subscribe(ctx, REDISMODULE_NOTIFY_ALL, Some(on_keyspace_event)) };
    }
}

/// Whether this load of the module has subscribed to keyspace events.
static SUBSCRIBED: AtomicBool = AtomicBool::new(false);

/// At every load: a library the dynamic loader kept mapped across MODULE
/// UNLOAD/LOAD keeps its statics, but the server dropped the subscription.
pub fn reset_at_load() {
    SUBSCRIBED.store(false, Relaxed);
    DRIVING.store(false, Relaxed);
    SERVING.store(false, Relaxed);
}

fn may_block(api: &Api, ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: the command's context.
    let flags = unsafe { (api.context_flags)(ctx) } as u32;
    let forbidden = REDISMODULE_CTX_FLAGS_MULTI
        | REDISMODULE_CTX_FLAGS_LUA
        | REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    flags & forbidden == 0
}

fn key_name(api: &Api, ctx: *mut RedisModuleCtx, key: *mut RedisModuleString) -> KeyName {
    // SAFETY: a live context and string.
    unsafe { ((api.selected_db)(ctx), api.bytes(&key).to_vec()) }
}

// --- Serving ----------------------------------------------------------------

/// Sets the key's wake-up `delay_ms` from now, unless one is due sooner.
fn schedule(api: &Api, ctx: *mut RedisModuleCtx, name: &KeyName, delay_ms: i64) {
    let delay_ms = delay_ms.clamp(0, MAX_TIMER_MS);
    let due_ms = api.wall_ms().saturating_add(delay_ms);
    let Some(pending) = with_queues(|queues| queues.timer(name)) else {
        return;
    };
    if let Some((timer, at_ms)) = pending {
        if at_ms <= due_ms {
            return;
        }
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: a timer of ours; its data comes back to be freed.
        if unsafe { (api.stop_timer)(ctx, timer, &mut data) } == REDISMODULE_OK as c_int {
            free_timer_data(data);
        }
    }
    let data = Box::into_raw(Box::new(name.clone())).cast::<c_void>();
    // SAFETY: a live context; `on_timer` takes the data back.
    let timer = unsafe { (api.create_timer)(ctx, delay_ms, Some(on_timer), data) };
    with_queues(|queues| queues.set_timer(name, Some((timer, due_ms))));
}

fn free_timer_data(data: *mut c_void) {
    if !data.is_null() {
        // SAFETY: made by `schedule` with Box::into_raw, freed once: here
        // or in `on_timer`, whichever the timer's end takes.
        drop(unsafe { Box::from_raw(data.cast::<KeyName>()) });
    }
}

extern "C" fn on_timer(ctx: *mut RedisModuleCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: as in `free_timer_data`; this timer has fired, so it is ours.
    let name = unsafe { Box::from_raw(data.cast::<KeyName>()) };
    let Some(api) = api::api() else {
        return;
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        with_queues(|queues| queues.set_timer(&name, None));
        drive(api, ctx, &name);
    }));
}

/// Set while `drive` unblocks a waiter: a callback the server runs at once
/// is then inside `drive`, which goes on with the next waiter itself.
static DRIVING: AtomicBool = AtomicBool::new(false);

/// Set while a served waiter's take is stored (see `serve`).
static SERVING: AtomicBool = AtomicBool::new(false);

/// Serves the key's queue from its head for as long as the head's tokens
/// are there, then sets the timer for the next head.
fn drive(api: &Api, ctx: *mut RedisModuleCtx, name: &KeyName) {
    // SAFETY: the timer's context, moved to the waiters' database.
    if unsafe { (api.select_db)(ctx, name.0) } != REDISMODULE_OK as c_int {
        return;
    }
    // SAFETY: a live context; the string is freed below.
    let key = unsafe { (api.create_string)(ctx, name.1.as_ptr().cast::<c_char>(), name.1.len()) };
    if key.is_null() {
        return;
    }
    loop {
        let head = with_queues(|queues| queues.head(name).map(|(id, w)| (id, w.clone())));
        let Some(Some((id, waiter))) = head else {
            with_queues(|queues| queues.forget_if_idle(name));
            break;
        };
        if waiter.state != WaitState::Waiting {
            break; // its callback has yet to run; it resumes the queue then
        }
        if !key_is_served_here(api, ctx, key) {
            // A slot on its way to another node: the server redirects the
            // waiters once it has moved; until then, look again shortly.
            schedule(api, ctx, name, MIGRATING_RECHECK_MS);
            break;
        }
        let judged = (|| {
            // SAFETY: a live context and key string.
            let mut bucket = unsafe { BucketKey::open(api, ctx, key, Access::Read) }?;
            let state = read(&mut bucket, KEY_ARG)?;
            Ok::<Outcome, TbError>(bucket::take(state, &waiter.limit, waiter.n, api.wall_ms()))
        })();
        let next = match judged {
            Ok(outcome) if !outcome.allowed => {
                schedule(api, ctx, name, outcome.retry_after_ms);
                break;
            }
            Ok(_) => WaitState::Serve,
            Err(_) => WaitState::Fail,
        };
        with_queues(|queues| queues.set_state(id, next));
        DRIVING.store(true, Relaxed);
        // SAFETY: the handle of a client still blocked (it leaves the queue
        // in every callback that ends its wait).
        unsafe {
            (api.unblock_client)(
                waiter.handle as *mut RedisModuleBlockedClient,
                id as usize as *mut c_void,
            )
        };
        DRIVING.store(false, Relaxed);
        // Still queued: its callback runs later and resumes the queue then.
        if with_queues(|queues| queues.get(id).is_some()).unwrap_or(true) {
            break;
        }
    }
    // SAFETY: created above, freed once.
    unsafe { (api.free_string)(ctx, key) };
}

/// How often a queue whose slot is being migrated away is looked at again.
const MIGRATING_RECHECK_MS: i64 = 100;

/// Whether this node would run a command on `key` now. Outside a cluster,
/// always. In one, a slot can be migrating away: a bucket already moved
/// reads as missing (a full bucket), and serving it here would write a key
/// this node no longer owns. `RM_Call` applies the server's own routing
/// (the same check that answers ASK or MOVED to a client), so an EXISTS
/// through it tells.
fn key_is_served_here(api: &Api, ctx: *mut RedisModuleCtx, key: *mut RedisModuleString) -> bool {
    // SAFETY: a live context.
    let flags = unsafe { (api.context_flags)(ctx) } as u32;
    if flags & REDISMODULE_CTX_FLAGS_CLUSTER == 0 {
        return true;
    }
    // SAFETY: a live context and key; the reply is freed at once.
    unsafe {
        let reply = (api.call)(ctx, c"EXISTS".as_ptr(), c"s".as_ptr(), key);
        if reply.is_null() {
            return false;
        }
        (api.free_call_reply)(reply);
    }
    true
}

/// The server's callback when a wait ends without a disconnect: because we
/// served the waiter (`drive`), its timeout passed, or CLIENT UNBLOCK.
extern "C" fn on_unblocked(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    if let Some(api) = api::api() {
        let _ = catch_unwind(AssertUnwindSafe(|| unblocked(api, ctx, argv, argc)));
    }
    REDISMODULE_OK as c_int
}

fn unblocked(api: &Api, ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) {
    // SAFETY: a blocked client's context; its private data is our id.
    let id = unsafe { (api.blocked_client_private_data)(ctx) } as usize as u64;
    let Some(Some(waiter)) = with_queues(|queues| queues.get(id).cloned()) else {
        return; // already answered
    };
    let args: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: the server passes the blocked command's argc strings.
        Ok(len) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, len) },
        _ => &[],
    };
    let resume = !DRIVING.load(Relaxed);
    match waiter.state {
        WaitState::Serve => {
            let result = serve(api, ctx, args, &waiter);
            if matches!(result, Ok(outcome) if outcome.allowed) {
                metrics::WAITS_SERVED.bump();
            } else {
                metrics::WAITS_TIMED_OUT.bump();
            }
            end_wait(api, ctx, id, &waiter);
            send(api, ctx, args, result.map(Into::into));
            if resume {
                schedule(api, ctx, &waiter.key, 0);
            }
        }
        WaitState::Fail => {
            end_wait(api, ctx, id, &waiter);
            send(api, ctx, args, Err(TbError::BucketGone));
            if resume {
                schedule(api, ctx, &waiter.key, 0);
            }
        }
        WaitState::Waiting => {
            // The timeout passed (or CLIENT UNBLOCK): a denial with the
            // figures of this moment; nothing is written.
            let others = with_queues(|queues| queues.ahead(&waiter.key))
                .flatten()
                .map_or(0.0, |(_, wanted)| (wanted - waiter.n).max(0.0));
            let result = args.get(KEY_ARG).ok_or(TbError::Internal).and_then(|&key| {
                // SAFETY: the blocked client's context and argument.
                let mut bucket = unsafe { BucketKey::open(api, ctx, key, Access::Read) }?;
                let state = read(&mut bucket, KEY_ARG)?;
                let now_ms = api.wall_ms();
                Ok(bucket::take_behind(
                    state,
                    &waiter.limit,
                    waiter.n,
                    others,
                    now_ms,
                ))
            });
            metrics::WAITS_TIMED_OUT.bump();
            if result.is_ok() {
                count_decision(false, waiter.n);
            }
            let was_head = end_wait(api, ctx, id, &waiter);
            send(api, ctx, args, result.map(Into::into));
            if was_head {
                schedule(api, ctx, &waiter.key, 0);
            }
        }
    }
}

/// The take of a served waiter, at this moment, on its own client's
/// context (so its database), stored and propagated like any TB.TAKE.
fn serve(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
    waiter: &Waiter,
) -> Result<Outcome, TbError> {
    let &key = args.get(KEY_ARG).ok_or(TbError::Internal)?;
    // SAFETY: the blocked client's context and argument.
    let mut bucket = unsafe { BucketKey::open(api, ctx, key, Access::Write) }?;
    let state = read(&mut bucket, KEY_ARG)?;
    let now_ms = api.wall_ms();
    let outcome = bucket::take(state, &waiter.limit, waiter.n, now_ms);
    let change = Change {
        bucket: &bucket,
        was_missing: state.is_none(),
        outcome,
    };
    // This write's own keyspace events need not wake the queue: whoever
    // serves it goes on with the next waiter anyway.
    SERVING.store(true, Relaxed);
    let stored = store(&[change], now_ms);
    SERVING.store(false, Relaxed);
    stored?;
    count_decision(outcome.allowed, waiter.n);
    Ok(outcome)
}

/// A waiter's timeout has passed: it is unblocked, and `on_unblocked`
/// answers it with a denial (its state is still `Waiting`).
extern "C" fn on_deadline(_ctx: *mut RedisModuleCtx, data: *mut c_void) {
    let Some(api) = api::api() else {
        return;
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let id = data as usize as u64;
        let waiting = with_queues(|queues| {
            let waiter = queues.get(id)?;
            (waiter.state == WaitState::Waiting).then_some(waiter.handle)
        });
        if let Some(Some(handle)) = waiting {
            with_queues(|queues| queues.clear_deadline(id));
            // SAFETY: the handle of a client still blocked.
            unsafe {
                (api.unblock_client)(handle as *mut RedisModuleBlockedClient, data);
            }
        }
    }));
}

/// Takes a waiter out of its queue and counts the time it waited; says
/// whether it was the head.
fn end_wait(api: &Api, ctx: *mut RedisModuleCtx, id: u64, waiter: &Waiter) -> bool {
    if let Some(Some(timer)) = with_queues(|queues| queues.get(id).and_then(|w| w.deadline_timer)) {
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: a timer of ours whose data is a number, nothing to free.
        unsafe { (api.stop_timer)(ctx, timer, &mut data) };
    }
    let waited_ms = api.wall_ms().saturating_sub(waiter.since_ms).max(0);
    metrics::WAIT_MS.add(waited_ms as f64);
    with_queues(|queues| queues.remove(id))
        .flatten()
        .is_some_and(|(_, was_head)| was_head)
}

/// A waiter that left without an answer: disconnected, CLIENT KILL, the
/// server turned into a replica, its slot moved away. It takes nothing.
extern "C" fn on_disconnect(ctx: *mut RedisModuleCtx, _handle: *mut RedisModuleBlockedClient) {
    let Some(api) = api::api() else {
        return;
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the blocked client's context; its private data is our id.
        let id = unsafe { (api.blocked_client_private_data)(ctx) } as usize as u64;
        let Some(Some(waiter)) = with_queues(|queues| queues.get(id).cloned()) else {
            return;
        };
        metrics::WAITS_ABANDONED.bump();
        let was_head = end_wait(api, ctx, id, &waiter);
        if was_head || waiter.state != WaitState::Waiting {
            schedule(api, ctx, &waiter.key, 0);
        }
    }));
}

/// The last callback of every wait: a waiter still queued here (never seen
/// by another callback) leaves the queue.
extern "C" fn on_free(ctx: *mut RedisModuleCtx, privdata: *mut c_void) {
    let Some(api) = api::api() else {
        return;
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let id = privdata as usize as u64;
        let Some(Some(waiter)) = with_queues(|queues| queues.get(id).cloned()) else {
            return;
        };
        if end_wait(api, ctx, id, &waiter) {
            schedule(api, ctx, &waiter.key, 0);
        }
    }));
}

/// The server offers the key to its waiters after some writes; the queue
/// decides who is served, so this only brings the key's wake-up forward.
extern "C" fn on_ready(
    ctx: *mut RedisModuleCtx,
    _argv: *mut *mut RedisModuleString,
    _argc: c_int,
) -> c_int {
    if let Some(api) = api::api() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: a blocked client's context; its private data is our id.
            let id = unsafe { (api.blocked_client_private_data)(ctx) } as usize as u64;
            if let Some(Some(waiter)) = with_queues(|queues| queues.get(id).cloned()) {
                schedule(api, ctx, &waiter.key, 0);
            }
        }));
    }
    REDISMODULE_ERR as c_int // stay blocked
}

/// Keyspace events (subscribed at load): any write to a key with waiters
/// (TB.REFUND, HSET by hand, DEL, an expiry, an eviction) re-evaluates its
/// queue at once.
extern "C" fn on_keyspace_event(
    ctx: *mut RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut RedisModuleString,
) -> c_int {
    if SERVING.load(Relaxed) {
        return REDISMODULE_OK as c_int;
    }
    if let Some(api) = api::api() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let name = match with_queues(|queues| !queues.is_empty()) {
                Some(true) => key_name(api, ctx, key),
                _ => return,
            };
            if with_queues(|queues| queues.ahead(&name).is_some()) == Some(true) {
                schedule(api, ctx, &name, 0);
            }
        }));
    }
    REDISMODULE_OK as c_int
}

/// FLUSHDB / FLUSHALL (subscribed at load): every bucket with waiters may
/// be gone, which is a full bucket.
pub extern "C" fn on_flush(
    ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    if let Some(api) = api::api() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            for name in with_queues(|queues| queues.keys()).unwrap_or_default() {
                schedule(api, ctx, &name, 0);
            }
        }));
    }
}

// --- The queues ---------------------------------------------------------------

/// The queues, reached only from the server's main thread (commands,
/// timers, blocked-client and keyspace callbacks all run there).
struct MainThread {
    queues: UnsafeCell<Option<Queues>>,
    borrowed: AtomicBool,
}

// SAFETY: see `with_queues`: one thread, and never two borrows at once.
unsafe impl Sync for MainThread {}

static QUEUES: MainThread = MainThread {
    queues: UnsafeCell::new(None),
    borrowed: AtomicBool::new(false),
};

/// Runs `f` on the queues. Every server call that can call back into this
/// module happens outside `f`; should one ever nest regardless (a bug), the
/// inner call gets `None` instead of a second, aliasing borrow.
fn with_queues<R>(f: impl FnOnce(&mut Queues) -> R) -> Option<R> {
    if QUEUES.borrowed.swap(true, Relaxed) {
        return None;
    }
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            QUEUES.borrowed.store(false, Relaxed);
        }
    }
    let _release = Release;
    // SAFETY: main thread only, and the flag above rules out a second
    // borrow while this one lives.
    let queues = unsafe { &mut *QUEUES.queues.get() };
    Some(f(queues.get_or_insert_with(Queues::default)))
}

//! TB.BTAKE key capacity rate n timeout_ms: wait in the server, first come
//! first served, until the bucket holds n.
//!
//! This file only translates: the command and every server callback become
//! an event of the waiting state machine (`wait.rs`), and its actions and
//! requests become module API calls. Which callbacks there are, and why:
//! - The client is blocked with `RM_BlockClientOnKeys` on its key, so the
//!   server itself ends the wait when it must, and says so: a slot that
//!   moved away (MOVED/ASK), the master turning replica (-UNBLOCKED), a
//!   disconnect or CLIENT KILL (`on_disconnect`), CLIENT UNBLOCK
//!   (`on_unblocked`). The server's own timeout is not used: it checks
//!   blocked clients only a few times a second, so each waiter with a
//!   timeout has a timer of its own (`on_deadline`), to the ms.
//! - Each key with waiters has one wake-up timer (`on_wake`), set for when
//!   its head can be served; the serving happens there.
//! - Keyspace events (`on_keyspace_event`, subscribed at the first wait)
//!   and the FLUSHDB and SWAPDB server events (`on_flush`, `on_swapdb`,
//!   subscribed at load) bring a key's wake-up forward to now.
//! - `on_unblocked` sends the reply the machine decided. Redis 7.0 and 7.2
//!   and Valkey run it inside `RM_UnblockClient`; Redis 7.4+ runs it just
//!   before the event loop sleeps. The machine takes the tokens before it
//!   unblocks anyone, so the order makes no difference to who gets what.
//! - Everything runs on the server's main thread.

use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

use redis_module::raw::{
    RedisModuleBlockedClient, RedisModuleCtx, RedisModuleEvent, RedisModuleFlushInfo,
    RedisModuleString, RedisModuleSwapDbInfo, RedisModule_SubscribeToKeyspaceEvents,
    REDISMODULE_CTX_FLAGS_CLUSTER, REDISMODULE_CTX_FLAGS_DENY_BLOCKING, REDISMODULE_CTX_FLAGS_LUA,
    REDISMODULE_CTX_FLAGS_MULTI, REDISMODULE_CTX_FLAGS_SLAVE, REDISMODULE_ERR,
    REDISMODULE_NOTIFY_EVICTED, REDISMODULE_NOTIFY_EXPIRED, REDISMODULE_NOTIFY_GENERIC,
    REDISMODULE_NOTIFY_HASH, REDISMODULE_NOTIFY_LIST, REDISMODULE_NOTIFY_MODULE,
    REDISMODULE_NOTIFY_SET, REDISMODULE_NOTIFY_STRING, REDISMODULE_NOTIFY_ZSET, REDISMODULE_OK,
};

use crate::api::{self, Api};
use crate::args::{parse_request, parse_timeout};
use crate::bucket::State;
use crate::commands::{count_decision, run, send, shadow, Reply, Single};
use crate::error::TbError;
use crate::metrics;
use crate::store::{store, Access, BucketKey, ServerString};
use crate::wait::{self, Action, Arrival, Db, Event, Timer, TimerId, WaiterId, Writable};

/// `tb.max-waiters`: how many clients may wait on one key.
pub const DEFAULT_MAX_WAITERS: i64 = 10_000;
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);

/// TB.BTAKE key capacity rate n timeout_ms
///
/// Exactly TB.TAKE when it can be granted at once (or may not wait: inside
/// MULTI, a script, or where the server forbids blocking; or in shadow
/// mode); otherwise the client waits behind those already waiting on the
/// key.
fn btake(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    args: &[*mut RedisModuleString],
) -> Result<Reply, TbError> {
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
    let outcome = single.charge.judge(single.now_ms);
    // `retry_after_ms = -1`: n exceeds the capacity and can never be granted.
    let would_wait = !outcome.allowed && outcome.retry_after_ms > 0;
    if !would_wait || !may_block(api, ctx) || crate::commands::SHADOW_MODE.load(Relaxed) {
        store(&[(&single.bucket, &outcome)], single.now_ms)?;
        count_decision(outcome.allowed, request.n);
        return Ok(Reply::Decision(shadow(outcome)));
    }
    // SAFETY: a live context and argument.
    let (db, name) = unsafe { ((api.selected_db)(ctx), api.bytes(&key)) };
    let waiting =
        wait::with_machine(|machine| machine.waiting_on(db, name)).ok_or(TbError::Internal)?;
    if i64::try_from(waiting).unwrap_or(i64::MAX) >= MAX_WAITERS.load(Relaxed) {
        return Err(TbError::TooManyWaiters);
    }
    // A denial writes nothing but a clock repair, stored before the wait.
    store(&[(&single.bucket, &outcome)], single.now_ms)?;
    drop(single);

    listen_to_keyspace(ctx);
    let id = wait::with_machine(wait::Machine::reserve).ok_or(TbError::Internal)?;
    let mut keys = [key];
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
        return Err(TbError::Internal);
    }
    // SAFETY: a handle the server just gave out.
    unsafe { (api.set_disconnect_callback)(handle, Some(on_disconnect)) };
    metrics::WAITS_STARTED.bump();
    dispatch(
        api,
        ctx,
        Event::Arrive(Arrival {
            id,
            client: handle as usize,
            db,
            key: name,
            limit: request.limit,
            n: request.n,
            timeout_ms,
            retry_after_ms: outcome.retry_after_ms,
            now_ms: api.wall_ms(),
        }),
    );
    Ok(Reply::Blocked)
}

pub extern "C" fn tb_btake(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    run(ctx, argv, argc, btake)
}

fn may_block(api: &Api, ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: the command's context.
    let flags = unsafe { (api.context_flags)(ctx) } as u32;
    let forbidden = REDISMODULE_CTX_FLAGS_MULTI
        | REDISMODULE_CTX_FLAGS_LUA
        | REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    flags & forbidden == 0
}

// --- Events in, actions out -----------------------------------------------

/// Hands `event` to the machine, with `ctx` as the server it may use, and
/// carries out what it returns. An action may make the server call back at
/// once (`RM_UnblockClient`): that happens after the machine is released.
fn dispatch(api: &Api, ctx: *mut RedisModuleCtx, event: Event<'_>) {
    let mut server = Glue { api, ctx };
    let Some((actions, waiting)) = wait::with_machine(|machine| {
        let actions = machine.on(event, &mut server);
        (actions, machine.waiting())
    }) else {
        return;
    };
    metrics::WAITING.set(u64::try_from(waiting).unwrap_or(u64::MAX));
    for action in actions {
        match action {
            // SAFETY: the handle of a client the machine knows is blocked
            // (it forgets a client in every callback that ends its wait).
            Action::Unblock(client) => unsafe {
                (api.unblock_client)(client as *mut RedisModuleBlockedClient, ptr::null_mut());
            },
            Action::Reply {
                result,
                n,
                waited_ms,
            } => {
                match result {
                    Ok(outcome) if outcome.allowed => metrics::WAITS_SERVED.bump(),
                    Ok(_) => metrics::WAITS_TIMED_OUT.bump(),
                    Err(_) => {}
                }
                if let Ok(outcome) = result {
                    count_decision(outcome.allowed, n);
                }
                metrics::WAIT_MS.add(waited_ms as f64);
                send(api, ctx, &[], result.map(Reply::Decision));
            }
            Action::Abandoned { waited_ms } => {
                metrics::WAITS_ABANDONED.bump();
                metrics::WAIT_MS.add(waited_ms as f64);
            }
        }
    }
}

/// The server as the machine sees it, through one callback's context.
struct Glue<'a> {
    api: &'a Api,
    ctx: *mut RedisModuleCtx,
}

impl Glue<'_> {
    /// Opens `key` of `db` on this context. A timer's context starts on db
    /// 0, so it is moved; a blocked client's context is already on the
    /// client's db (moving it would move the client).
    fn key(&self, db: Db, key: &[u8]) -> Result<ServerString<'_>, TbError> {
        // SAFETY: a live context.
        let here = unsafe { (self.api.selected_db)(self.ctx) };
        if here != db && unsafe { (self.api.select_db)(self.ctx, db) } != REDISMODULE_OK as c_int {
            return Err(TbError::Internal);
        }
        ServerString::copy(self.api, self.ctx, key).ok_or(TbError::Internal)
    }
}

impl wait::Server for Glue<'_> {
    fn read(&mut self, db: Db, key: &[u8]) -> Result<Option<State>, TbError> {
        let name = self.key(db, key)?;
        // SAFETY: a live context and key string.
        let mut bucket = unsafe { BucketKey::open(self.api, self.ctx, name.ptr(), Access::Read) }
            .map_err(|_| TbError::BucketGone)?;
        bucket.read().map_err(|_| TbError::BucketGone)
    }

    fn write(
        &mut self,
        db: Db,
        key: &[u8],
        state: &State,
        now_ms: i64,
        expire_at_ms: i64,
    ) -> Result<(), TbError> {
        let name = self.key(db, key)?;
        // SAFETY: a live context and key string.
        let mut bucket = unsafe { BucketKey::open(self.api, self.ctx, name.ptr(), Access::Write) }
            .map_err(|_| TbError::BucketGone)?;
        bucket.read().map_err(|_| TbError::BucketGone)?;
        // This write's own keyspace events need not wake the queue: the
        // machine is serving it right now.
        WRITING.store(true, Relaxed);
        let written = bucket.write(state, now_ms, expire_at_ms);
        WRITING.store(false, Relaxed);
        written
    }

    fn writable(&mut self, db: Db, key: &[u8]) -> Writable {
        // SAFETY: plain server functions on a live context.
        unsafe {
            if let Some(avoid_replica_traffic) = self.api.avoid_replica_traffic {
                // True while writes are paused: propagating then aborts the
                // server, and expiry is paused too.
                if avoid_replica_traffic() != 0 {
                    return Writable::Paused;
                }
            }
            let flags = (self.api.context_flags)(self.ctx) as u32;
            if flags & REDISMODULE_CTX_FLAGS_SLAVE != 0 {
                return Writable::Paused;
            }
            if flags & REDISMODULE_CTX_FLAGS_CLUSTER != 0 && !self.served_here(db, key) {
                return Writable::Elsewhere;
            }
        }
        Writable::Yes
    }

    fn arm(&mut self, timer: Timer<'_>, delay_ms: i64) -> TimerId {
        let (callback, data): (extern "C" fn(*mut RedisModuleCtx, *mut c_void), *mut c_void) =
            match timer {
                Timer::Wake { db, key, token } => {
                    let data = Box::new(WakeData {
                        db,
                        key: key.to_vec(),
                        token,
                    });
                    (on_wake, Box::into_raw(data).cast())
                }
                Timer::Deadline(id) => (on_deadline, id as usize as *mut c_void),
            };
        // SAFETY: a live context; `on_wake` takes its data back.
        unsafe { (self.api.create_timer)(self.ctx, delay_ms, Some(callback), data) }
    }

    fn cancel(&mut self, timer: TimerId, wake: bool) {
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: a timer of ours; a wake-up's data comes back to be freed.
        let stopped = unsafe { (self.api.stop_timer)(self.ctx, timer, &mut data) };
        if stopped == REDISMODULE_OK as c_int && wake && !data.is_null() {
            // SAFETY: made by `arm` with Box::into_raw; the timer will not
            // fire now, so this is its only owner.
            drop(unsafe { Box::from_raw(data.cast::<WakeData>()) });
        }
    }
}

impl Glue<'_> {
    /// Whether this node may write `key` now. In a cluster a slot can be
    /// on the move. On the node it leaves, a bucket already moved reads as
    /// missing (a full bucket), and serving it there would write a key that
    /// node no longer owns. `RM_Call` applies the server's own routing (the
    /// check that answers ASK or MOVED to a client), so an EXISTS through it
    /// tells whether the node owns the key outright. If it does not, the
    /// bucket may still be here: on the node a slot moves to, a client sent
    /// on by ASK waits on a bucket already moved in, and that node is where
    /// it lives now.
    unsafe fn served_here(&self, db: Db, key: &[u8]) -> bool {
        let Ok(name) = self.key(db, key) else {
            return false;
        };
        let reply = (self.api.call)(self.ctx, c"EXISTS".as_ptr(), c"s".as_ptr(), name.ptr());
        if !reply.is_null() {
            (self.api.free_call_reply)(reply);
            return true;
        }
        BucketKey::open(self.api, self.ctx, name.ptr(), Access::Read)
            .is_ok_and(|bucket| bucket.exists())
    }
}

/// Set while the machine writes a bucket.
static WRITING: AtomicBool = AtomicBool::new(false);

/// A wake-up timer's data.
struct WakeData {
    db: Db,
    key: Vec<u8>,
    token: u64,
}

// --- Server callbacks -------------------------------------------------------

/// Runs a callback's body; a panic (a bug) must not cross into the server.
fn guarded(body: impl FnOnce(&'static Api)) {
    if let Some(api) = api::api() {
        let _ = catch_unwind(AssertUnwindSafe(|| body(api)));
    }
}

fn waiter_id(api: &Api, ctx: *mut RedisModuleCtx) -> WaiterId {
    // SAFETY: a blocked client's context; its private data is our id.
    unsafe { (api.blocked_client_private_data)(ctx) as usize as WaiterId }
}

extern "C" fn on_wake(ctx: *mut RedisModuleCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: made by `Glue::arm`; the timer has fired, so it is ours.
    let data = unsafe { Box::from_raw(data.cast::<WakeData>()) };
    guarded(|api| {
        let event = Event::Wake {
            db: data.db,
            key: &data.key,
            token: data.token,
            now_ms: api.wall_ms(),
        };
        dispatch(api, ctx, event);
    });
}

extern "C" fn on_deadline(ctx: *mut RedisModuleCtx, data: *mut c_void) {
    guarded(|api| {
        let id = data as usize as WaiterId;
        dispatch(
            api,
            ctx,
            Event::Deadline {
                id,
                now_ms: api.wall_ms(),
            },
        );
    });
}

/// The server's callback when a wait ends with a reply: after the machine
/// unblocked it, or CLIENT UNBLOCK.
extern "C" fn on_unblocked(
    ctx: *mut RedisModuleCtx,
    _argv: *mut *mut RedisModuleString,
    _argc: c_int,
) -> c_int {
    guarded(|api| {
        let id = waiter_id(api, ctx);
        dispatch(
            api,
            ctx,
            Event::Unblocked {
                id,
                now_ms: api.wall_ms(),
            },
        );
    });
    REDISMODULE_OK as c_int
}

/// A waiter that left without an answer: disconnected, CLIENT KILL, the
/// server turned replica, its slot moved away.
extern "C" fn on_disconnect(ctx: *mut RedisModuleCtx, _handle: *mut RedisModuleBlockedClient) {
    guarded(|api| {
        let id = waiter_id(api, ctx);
        dispatch(
            api,
            ctx,
            Event::Left {
                id,
                now_ms: api.wall_ms(),
            },
        );
    });
}

/// The last callback of every wait.
extern "C" fn on_free(ctx: *mut RedisModuleCtx, privdata: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    guarded(|api| {
        let id = privdata as usize as WaiterId;
        dispatch(api, ctx, Event::Freed { id });
    });
}

/// The server offers the key to its waiters after some writes; the machine
/// decides who is served, so this only brings the key's wake-up forward.
extern "C" fn on_ready(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    guarded(|api| {
        if argv.is_null() || argc < 2 {
            return;
        }
        // SAFETY: the blocked command's argc strings; the key is argv[1].
        let key = unsafe { *argv.add(1) };
        changed(api, ctx, key);
    });
    REDISMODULE_ERR as c_int // stay blocked
}

/// The keyspace events that can change a bucket someone waits on: its own
/// writes (hash), DEL, RENAME, MOVE, RESTORE, COPY, EXPIRE (generic), its
/// expiry and eviction, and a value of another type written over it: SET
/// and BITOP (string), SORT .. STORE (list), the *STORE commands of sets and
/// sorted sets, and other modules' types. Streams are left out: no stream
/// command replaces an existing key.
const KEYSPACE_EVENTS: c_int = REDISMODULE_NOTIFY_GENERIC
    | REDISMODULE_NOTIFY_STRING
    | REDISMODULE_NOTIFY_LIST
    | REDISMODULE_NOTIFY_SET
    | REDISMODULE_NOTIFY_HASH
    | REDISMODULE_NOTIFY_ZSET
    | REDISMODULE_NOTIFY_EXPIRED
    | REDISMODULE_NOTIFY_EVICTED
    | REDISMODULE_NOTIFY_MODULE;

/// Subscribes `on_keyspace_event` on the first wait: the server creates a
/// context for every event it hands a module, a cost every write would pay
/// on a server that never waits. There is no way to unsubscribe, so it
/// stays once made; a key nobody waits on then costs one hash lookup.
fn listen_to_keyspace(ctx: *mut RedisModuleCtx) {
    if SUBSCRIBED.swap(true, Relaxed) {
        return;
    }
    // SAFETY: a command's context; the pointer was set by RedisModule_Init.
    if let Some(subscribe) = unsafe { RedisModule_SubscribeToKeyspaceEvents } {
        unsafe { subscribe(ctx, KEYSPACE_EVENTS, Some(on_keyspace_event)) };
    }
}

/// Whether this load of the module has subscribed to keyspace events.
static SUBSCRIBED: AtomicBool = AtomicBool::new(false);

/// At every load: a library the dynamic loader kept mapped across MODULE
/// UNLOAD/LOAD keeps its statics, but the server dropped the subscription.
pub fn reset_at_load() {
    SUBSCRIBED.store(false, Relaxed);
    WRITING.store(false, Relaxed);
    wait::with_machine(|machine| *machine = wait::Machine::default());
    metrics::WAITING.set(0);
}

extern "C" fn on_keyspace_event(
    ctx: *mut RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut RedisModuleString,
) -> c_int {
    if !WRITING.load(Relaxed) {
        guarded(|api| changed(api, ctx, key));
    }
    REDISMODULE_OK as c_int
}

/// A key may have changed; only a key with waiters costs more than a lookup.
fn changed(api: &Api, ctx: *mut RedisModuleCtx, key: *mut RedisModuleString) {
    // SAFETY: a live context and string.
    let (db, name) = unsafe { ((api.selected_db)(ctx), api.bytes(&key)) };
    let waited = wait::with_machine(|machine| machine.queued(db, name).is_some());
    if waited == Some(true) {
        let now_ms = api.wall_ms();
        dispatch(
            api,
            ctx,
            Event::Changed {
                db,
                key: name,
                now_ms,
            },
        );
    }
}

/// FLUSHDB / FLUSHALL (subscribed at load): the buckets are gone, which
/// makes them full.
pub extern "C" fn on_flush(
    ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    guarded(|api| {
        if data.is_null() {
            return;
        }
        // SAFETY: the server passes a RedisModuleFlushInfo for this event.
        let dbnum = unsafe { (*data.cast::<RedisModuleFlushInfo>()).dbnum };
        let db = (dbnum >= 0).then_some(dbnum);
        let now_ms = api.wall_ms();
        dispatch(api, ctx, Event::Flushed { db, now_ms });
    });
}

/// SWAPDB (subscribed at load; it fires no keyspace event).
pub extern "C" fn on_swapdb(
    ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    guarded(|api| {
        if data.is_null() {
            return;
        }
        // SAFETY: the server passes a RedisModuleSwapDbInfo for this event.
        let info = unsafe { *data.cast::<RedisModuleSwapDbInfo>() };
        let now_ms = api.wall_ms();
        let event = Event::Swapped {
            a: info.dbnum_first,
            b: info.dbnum_second,
            now_ms,
        };
        dispatch(api, ctx, event);
    });
}

/// MODULE UNLOAD: the server refuses it while clients wait or timers are
/// pending, so this only drops what is left.
pub fn on_unload(api: &Api, ctx: *mut RedisModuleCtx) {
    dispatch(api, ctx, Event::Unload);
}

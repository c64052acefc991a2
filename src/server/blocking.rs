//! Blocking clients, for every kind of wait (the core's `wait::Kind`):
//! blocking a client, and every server callback turned into an event of
//! that kind's machine (core/src/wait/mod.rs), its actions and requests
//! into module API calls. TB.BTAKE (src/bucket/btake.rs) and TB.ACQUIRE
//! (src/lease/commands.rs) use it alike.
//!
//! Which callbacks there are, and why:
//! - The client is blocked with `RM_BlockClientOnKeys` on its key
//!   ([`block`]), so the server itself ends the wait when it must, and says
//!   so: a slot that moved away (MOVED/ASK), the master turning replica
//!   (-UNBLOCKED), a disconnect or CLIENT KILL (`on_disconnect`), CLIENT
//!   UNBLOCK (`on_unblocked`). The server's own timeout is not used: it
//!   checks blocked clients only a few times a second, so each waiter with
//!   a timeout has a timer of its own (`on_deadline`), to the ms.
//! - Each key with waiters has one wake-up timer (`on_wake`), set for when
//!   its head can be served; the serving happens there.
//! - Keyspace events (`on_keyspace_event`, subscribed at the first wait)
//!   and the FLUSHDB and SWAPDB server events (`on_flush`, `on_swapdb`,
//!   subscribed at load) bring a key's wake-up forward to now, in every
//!   kind's machine.
//! - `on_unblocked` sends the reply the machine decided. Redis 7.0 and 7.2
//!   and Valkey run it inside `RM_UnblockClient`; Redis 7.4+ runs it just
//!   before the event loop sleeps. The machine serves before it unblocks
//!   anyone, so the order makes no difference to who gets what.
//! - Everything runs on the server's main thread.
//!
//! A kind plugs in with [`GlueKind`]: how its state is read from and
//! written to a key, whether a key holds its value, how a waiter's reply is
//! sent, and its counters. The callbacks are generic over the kind (one
//! copy each per kind, no dynamic dispatch), and each kind's machine has
//! waiter ids of its own. A new kind is also added to [`every_kind`], so
//! keyspace events, flushes, SWAPDB, load and unload reach its machine.

use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_module::raw::{
    RedisModuleBlockedClient, RedisModuleCtx, RedisModuleEvent, RedisModuleFlushInfo,
    RedisModuleString, RedisModuleSwapDbInfo, RedisModule_SubscribeToKeyspaceEvents,
    REDISMODULE_CTX_FLAGS_CLUSTER, REDISMODULE_CTX_FLAGS_DENY_BLOCKING, REDISMODULE_CTX_FLAGS_LUA,
    REDISMODULE_CTX_FLAGS_MULTI, REDISMODULE_CTX_FLAGS_SLAVE, REDISMODULE_ERR,
    REDISMODULE_NOTIFY_EVICTED, REDISMODULE_NOTIFY_EXPIRED, REDISMODULE_NOTIFY_GENERIC,
    REDISMODULE_NOTIFY_HASH, REDISMODULE_NOTIFY_LIST, REDISMODULE_NOTIFY_MODULE,
    REDISMODULE_NOTIFY_SET, REDISMODULE_NOTIFY_STRING, REDISMODULE_NOTIFY_ZSET, REDISMODULE_OK,
};

use redis_tb_core::error::TbError;
use redis_tb_core::wait::leases::Leases;
use redis_tb_core::wait::tokens::Tokens;
use redis_tb_core::wait::{
    self, Action, Arrival, Db, Event, Machine, Timer, TimerId, WaiterId, Writable,
};

use super::api;
use super::config::MAX_WAITERS;
use super::context::Context;
use super::machines::{with_machine, HasMachine};
use super::metrics;
use super::strings::{ServerStr, ServerString};

/// What a kind of wait supplies on the server side. Every function gets a
/// context that is on the key's database; none may block or call back
/// into the module's waiting (`with_machine`).
pub trait GlueKind: HasMachine {
    /// The key's state as [`wait::Server::read`] returns it: an error when
    /// the key holds a value of another type.
    fn read(ctx: Context, key: &ServerStr, now_ms: i64) -> Result<Self::State, TbError>;

    /// Stores and propagates `state` as served ([`wait::Server::write`]),
    /// all or nothing. Its own keyspace events do not wake the queue.
    fn write(
        ctx: Context,
        key: &ServerStr,
        state: &Self::State,
        now_ms: i64,
    ) -> Result<(), TbError>;

    /// Whether this node's keyspace holds the key (with this kind's
    /// value): in a cluster, a slot on the move is served where the key is.
    fn exists(ctx: Context, key: &ServerStr) -> bool;

    /// Sends a waiter's reply from its callback (`ctx`) and counts it:
    /// served, denied at its timeout, or an error.
    fn reply(
        ctx: Context,
        key: &[u8],
        result: Result<Self::Reply, TbError>,
        request: &Self::Request,
        waited_ms: i64,
    );

    /// Counts a wait that started (every kind alike).
    fn started() {
        metrics::WAITS_STARTED.bump();
    }

    /// Counts a waiter that left without a reply (every kind alike).
    fn abandoned(waited_ms: i64) {
        metrics::WAITS_ABANDONED.bump();
        metrics::WAIT_MS.add(waited_ms as f64);
    }

    /// This kind's clients waiting now, after every event.
    fn waiting(count: usize);
}

/// Every kind's machine gets `event`: keyspace events, flushes, SWAPDB,
/// load and unload concern them all. A new kind is one more line here.
fn every_kind(ctx: Context, event: Everyone<'_>) {
    to_kind::<Tokens>(ctx, event);
    to_kind::<Leases>(ctx, event);
}

/// The events every kind's machine gets.
#[derive(Clone, Copy, Debug)]
enum Everyone<'a> {
    /// A key may have changed; only a kind with waiters on it is told.
    Changed {
        db: Db,
        key: &'a [u8],
        now_ms: i64,
    },
    Flushed {
        db: Option<Db>,
        now_ms: i64,
    },
    Swapped {
        a: Db,
        b: Db,
        now_ms: i64,
    },
    Unload,
    /// A new load of the module: the machine starts empty.
    Reset,
}

fn to_kind<K: GlueKind>(ctx: Context, event: Everyone<'_>) {
    let event = match event {
        Everyone::Changed { db, key, now_ms } => {
            let waited = with_machine::<K, _>(|machine| machine.queued(db, key).is_some());
            if waited != Some(true) {
                return;
            }
            Event::Changed { db, key, now_ms }
        }
        Everyone::Flushed { db, now_ms } => Event::Flushed { db, now_ms },
        Everyone::Swapped { a, b, now_ms } => Event::Swapped { a, b, now_ms },
        Everyone::Unload => Event::Unload,
        Everyone::Reset => {
            with_machine::<K, _>(|machine| *machine = Machine::default());
            K::waiting(0);
            return;
        }
    };
    dispatch::<K>(ctx, event);
}

/// Whether the command may wait: not inside MULTI, a script, or where the
/// server forbids blocking.
pub fn may_block(ctx: Context) -> bool {
    // SAFETY: the command's context.
    let flags = unsafe { (ctx.api().context_flags)(ctx.ptr()) } as u32;
    let forbidden = REDISMODULE_CTX_FLAGS_MULTI
        | REDISMODULE_CTX_FLAGS_LUA
        | REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    flags & forbidden == 0
}

/// Refuses one more waiter on a key that has `tb.max-waiters` of kind `K`.
pub fn room<K: GlueKind>(db: Db, key: &[u8]) -> Result<(), TbError> {
    let waiting =
        with_machine::<K, _>(|machine| machine.waiting_on(db, key)).ok_or(TbError::Internal)?;
    if i64::try_from(waiting).unwrap_or(i64::MAX) >= MAX_WAITERS.load(Relaxed) {
        return Err(TbError::TooManyWaiters);
    }
    Ok(())
}

/// Blocks the command's client on `key` (of database `db`, named `name`)
/// until `K`'s machine serves `request`, `timeout_ms` passes (0: never),
/// or the client goes. `retry_after_ms`: when the request could be served,
/// as judged on arrival. The command then replies `Reply::Blocked`.
pub fn block<K: GlueKind>(
    ctx: Context,
    key: &ServerStr,
    (db, name): (Db, &[u8]),
    request: K::Request,
    timeout_ms: i64,
    retry_after_ms: i64,
) -> Result<(), TbError> {
    let api = ctx.api();
    listen_to_keyspace(ctx);
    let id = with_machine::<K, _>(Machine::reserve).ok_or(TbError::Internal)?;
    let mut keys = [key.ptr()];
    // SAFETY: the command's context and key; the id travels as the private
    // data (never dereferenced: it is a number).
    let handle = unsafe {
        (api.block_client_on_keys)(
            ctx.ptr(),
            Some(on_ready::<K>),
            Some(on_unblocked::<K>),
            Some(on_free::<K>),
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
    unsafe { (api.set_disconnect_callback)(handle, Some(on_disconnect::<K>)) };
    K::started();
    dispatch::<K>(
        ctx,
        Event::Arrive(Arrival {
            id,
            client: handle as usize,
            db,
            key: name,
            request,
            timeout_ms,
            retry_after_ms,
            now_ms: api.wall_ms(),
        }),
    );
    Ok(())
}

// --- Events in, actions out -----------------------------------------------

/// Hands `event` to `K`'s machine, with `ctx` as the server it may use, and
/// carries out what it returns. An action may make the server call back at
/// once (`RM_UnblockClient`): that happens after the machine is released.
fn dispatch<K: GlueKind>(ctx: Context, event: Event<'_, K>) {
    let mut server = Glue::<K> {
        ctx,
        kind: std::marker::PhantomData,
    };
    let Some((actions, waiting)) = with_machine::<K, _>(|machine| {
        let actions = machine.on(event, &mut server);
        (actions, machine.waiting())
    }) else {
        return;
    };
    K::waiting(waiting);
    for action in actions {
        match action {
            // SAFETY: the handle of a client the machine knows is blocked
            // (it forgets a client in every callback that ends its wait).
            Action::Unblock(client) => unsafe {
                (ctx.api().unblock_client)(
                    client as *mut RedisModuleBlockedClient,
                    ptr::null_mut(),
                );
            },
            Action::Reply {
                result,
                key,
                request,
                waited_ms,
            } => K::reply(ctx, &key, result, &request, waited_ms),
            Action::Abandoned { waited_ms } => K::abandoned(waited_ms),
        }
    }
}

/// The server as `K`'s machine sees it, through one callback's context.
struct Glue<'a, K> {
    ctx: Context<'a>,
    kind: std::marker::PhantomData<K>,
}

impl<'a, K> Glue<'a, K> {
    /// Opens `key` of `db` on this context. A timer's context starts on db
    /// 0, so it is moved; a blocked client's context is already on the
    /// client's db (moving it would move the client).
    fn key(&self, db: Db, key: &[u8]) -> Result<ServerString<'a>, TbError> {
        let here = self.ctx.selected_db();
        // SAFETY: a live context.
        if here != db
            && unsafe { (self.ctx.api().select_db)(self.ctx.ptr(), db) } != REDISMODULE_OK as c_int
        {
            return Err(TbError::Internal);
        }
        self.ctx.string(key).ok_or(TbError::Internal)
    }
}

impl<K: GlueKind> wait::Server<K> for Glue<'_, K> {
    fn read(&mut self, db: Db, key: &[u8], now_ms: i64) -> Result<K::State, TbError> {
        let name = self.key(db, key)?;
        K::read(self.ctx, &name, now_ms)
    }

    fn write(&mut self, db: Db, key: &[u8], state: &K::State, now_ms: i64) -> Result<(), TbError> {
        let name = self.key(db, key)?;
        // This write's own keyspace events need not wake the queue: the
        // machine is serving it right now.
        WRITING.store(true, Relaxed);
        let written = K::write(self.ctx, &name, state, now_ms);
        WRITING.store(false, Relaxed);
        written
    }

    fn writable(&mut self, db: Db, key: &[u8]) -> Writable {
        let api = self.ctx.api();
        // SAFETY: plain server functions on a live context.
        unsafe {
            if let Some(avoid_replica_traffic) = api.avoid_replica_traffic {
                // True while writes are paused: propagating then aborts the
                // server, and expiry is paused too.
                if avoid_replica_traffic() != 0 {
                    return Writable::Paused;
                }
            }
            let flags = (api.context_flags)(self.ctx.ptr()) as u32;
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
                    (on_wake::<K>, Box::into_raw(data).cast())
                }
                Timer::Deadline(id) => (on_deadline::<K>, id as usize as *mut c_void),
            };
        // SAFETY: a live context; `on_wake` takes its data back.
        unsafe { (self.ctx.api().create_timer)(self.ctx.ptr(), delay_ms, Some(callback), data) }
    }

    fn cancel(&mut self, timer: TimerId, wake: bool) {
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: a timer of ours; a wake-up's data comes back to be freed.
        let stopped = unsafe { (self.ctx.api().stop_timer)(self.ctx.ptr(), timer, &mut data) };
        if stopped == REDISMODULE_OK as c_int && wake && !data.is_null() {
            // SAFETY: made by `arm` with Box::into_raw; the timer will not
            // fire now, so this is its only owner.
            drop(unsafe { Box::from_raw(data.cast::<WakeData>()) });
        }
    }
}

impl<K: GlueKind> Glue<'_, K> {
    /// Whether this node may write `key` now. In a cluster a slot can be
    /// on the move. On the node it leaves, a key already moved reads as
    /// missing (for a bucket: a full one), and serving it there would write
    /// a key that node no longer owns. `RM_Call` applies the server's own
    /// routing (the check that answers ASK or MOVED to a client), so an
    /// EXISTS through it tells whether the node owns the key outright. If
    /// it does not, the key may still be here: on the node a slot moves to,
    /// a client sent on by ASK waits on a key already moved in, and that
    /// node is where it lives now.
    unsafe fn served_here(&self, db: Db, key: &[u8]) -> bool {
        let Ok(name) = self.key(db, key) else {
            return false;
        };
        let api = self.ctx.api();
        let reply = (api.call)(
            self.ctx.ptr(),
            c"EXISTS".as_ptr(),
            c"s".as_ptr(),
            name.ptr(),
        );
        if !reply.is_null() {
            (api.free_call_reply)(reply);
            return true;
        }
        K::exists(self.ctx, &name)
    }
}

/// Set while a machine writes a key.
static WRITING: AtomicBool = AtomicBool::new(false);

/// A wake-up timer's data.
struct WakeData {
    db: Db,
    key: Vec<u8>,
    token: u64,
}

// --- Server callbacks -------------------------------------------------------

/// Runs a callback's body on its context; a panic (a bug) must not cross
/// into the server.
///
/// # Safety
/// `ctx` must be the live context the server called back with.
unsafe fn guarded(ctx: *mut RedisModuleCtx, body: impl FnOnce(Context)) {
    if let Some(api) = api::api() {
        // SAFETY: as the caller promises; the body cannot keep it.
        let ctx = unsafe { Context::new(api, ctx) };
        let _ = catch_unwind(AssertUnwindSafe(|| body(ctx)));
    }
}

fn waiter_id(ctx: Context) -> WaiterId {
    // SAFETY: a blocked client's context; its private data is our id.
    unsafe { (ctx.api().blocked_client_private_data)(ctx.ptr()) as usize as WaiterId }
}

extern "C" fn on_wake<K: GlueKind>(ctx: *mut RedisModuleCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: made by `Glue::arm`; the timer has fired, so it is ours.
    let data = unsafe { Box::from_raw(data.cast::<WakeData>()) };
    // SAFETY: the timer's context.
    unsafe {
        guarded(ctx, |ctx| {
            let event = Event::Wake {
                db: data.db,
                key: &data.key,
                token: data.token,
                now_ms: ctx.wall_ms(),
            };
            dispatch::<K>(ctx, event);
        })
    };
}

extern "C" fn on_deadline<K: GlueKind>(ctx: *mut RedisModuleCtx, data: *mut c_void) {
    // SAFETY: the timer's context.
    unsafe {
        guarded(ctx, |ctx| {
            let id = data as usize as WaiterId;
            let now_ms = ctx.wall_ms();
            dispatch::<K>(ctx, Event::Deadline { id, now_ms });
        })
    };
}

/// The server's callback when a wait ends with a reply: after the machine
/// unblocked it, or CLIENT UNBLOCK.
extern "C" fn on_unblocked<K: GlueKind>(
    ctx: *mut RedisModuleCtx,
    _argv: *mut *mut RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the blocked client's context.
    unsafe {
        guarded(ctx, |ctx| {
            let (id, now_ms) = (waiter_id(ctx), ctx.wall_ms());
            dispatch::<K>(ctx, Event::Unblocked { id, now_ms });
        })
    };
    REDISMODULE_OK as c_int
}

/// A waiter that left without an answer: disconnected, CLIENT KILL, the
/// server turned replica, its slot moved away.
extern "C" fn on_disconnect<K: GlueKind>(
    ctx: *mut RedisModuleCtx,
    _handle: *mut RedisModuleBlockedClient,
) {
    // SAFETY: the blocked client's context.
    unsafe {
        guarded(ctx, |ctx| {
            let (id, now_ms) = (waiter_id(ctx), ctx.wall_ms());
            dispatch::<K>(ctx, Event::Left { id, now_ms });
        })
    };
}

/// The last callback of every wait.
extern "C" fn on_free<K: GlueKind>(ctx: *mut RedisModuleCtx, privdata: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: the blocked client's context (checked non-null above).
    unsafe {
        guarded(ctx, |ctx| {
            let id = privdata as usize as WaiterId;
            dispatch::<K>(ctx, Event::Freed { id });
        })
    };
}

/// The server offers the key to its waiters after some writes; the machine
/// decides who is served, so this only brings the key's wake-up forward.
extern "C" fn on_ready<K: GlueKind>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    if argv.is_null() || argc < 2 {
        return REDISMODULE_ERR as c_int; // stay blocked
    }
    // SAFETY: the blocked command's argc strings; the key is argv[1].
    let key = unsafe { ServerStr::at(&*argv.add(1)) };
    // SAFETY: the blocked client's context.
    unsafe {
        guarded(ctx, |ctx| {
            let (db, now_ms) = (ctx.selected_db(), ctx.wall_ms());
            to_kind::<K>(
                ctx,
                Everyone::Changed {
                    db,
                    key: key.bytes(),
                    now_ms,
                },
            );
        })
    };
    REDISMODULE_ERR as c_int // stay blocked
}

/// The keyspace events that can change a key someone waits on: a bucket's
/// own writes (hash), a lease key's (sorted set), DEL, RENAME, MOVE,
/// RESTORE, COPY, EXPIRE (generic), its expiry and eviction, and a value of
/// another type written over it: SET and BITOP (string), SORT .. STORE
/// (list), the *STORE commands of sets and sorted sets, and other modules'
/// types. Streams are left out: no stream command replaces an existing key.
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
/// stays once made; a key nobody waits on then costs one hash lookup per
/// kind.
fn listen_to_keyspace(ctx: Context) {
    if SUBSCRIBED.swap(true, Relaxed) {
        return;
    }
    // SAFETY: a command's context; the pointer was set by RedisModule_Init.
    if let Some(subscribe) = unsafe { RedisModule_SubscribeToKeyspaceEvents } {
        unsafe { subscribe(ctx.ptr(), KEYSPACE_EVENTS, Some(on_keyspace_event)) };
    }
}

/// Whether this load of the module has subscribed to keyspace events.
static SUBSCRIBED: AtomicBool = AtomicBool::new(false);

/// At every load: a library the dynamic loader kept mapped across MODULE
/// UNLOAD/LOAD keeps its statics, but the server dropped the subscription.
///
/// # Safety
/// `ctx` must be the load's context.
pub unsafe fn reset_at_load(api: &'static api::Api, ctx: *mut RedisModuleCtx) {
    SUBSCRIBED.store(false, Relaxed);
    WRITING.store(false, Relaxed);
    // SAFETY: as the caller promises.
    every_kind(unsafe { Context::new(api, ctx) }, Everyone::Reset);
}

extern "C" fn on_keyspace_event(
    ctx: *mut RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut RedisModuleString,
) -> c_int {
    if !WRITING.load(Relaxed) && !key.is_null() {
        // SAFETY: the event's context and key name, live for the callback.
        unsafe {
            let key = ServerStr::at(&key);
            guarded(ctx, |ctx| {
                let (db, now_ms) = (ctx.selected_db(), ctx.wall_ms());
                every_kind(
                    ctx,
                    Everyone::Changed {
                        db,
                        key: key.bytes(),
                        now_ms,
                    },
                );
            })
        };
    }
    REDISMODULE_OK as c_int
}

/// FLUSHDB / FLUSHALL (subscribed at load): the keys are gone (for a
/// bucket: it is full).
pub extern "C" fn on_flush(
    ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    // SAFETY: the server passes a RedisModuleFlushInfo for this event.
    unsafe {
        to_every_kind(ctx, data, |info: RedisModuleFlushInfo, now_ms| {
            let db = (info.dbnum >= 0).then_some(info.dbnum);
            Everyone::Flushed { db, now_ms }
        })
    };
}

/// SWAPDB (subscribed at load; it fires no keyspace event).
pub extern "C" fn on_swapdb(
    ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    // SAFETY: the server passes a RedisModuleSwapDbInfo for this event.
    unsafe {
        to_every_kind(ctx, data, |info: RedisModuleSwapDbInfo, now_ms| {
            Everyone::Swapped {
                a: info.dbnum_first,
                b: info.dbnum_second,
                now_ms,
            }
        })
    };
}

/// A server event's `data`, read as the `Info` the server passes with it,
/// becomes `event` for every kind's machine, at the wall clock's now.
///
/// # Safety
/// `data` must be null or point to an `Info`.
unsafe fn to_every_kind<Info: Copy>(
    ctx: *mut RedisModuleCtx,
    data: *mut c_void,
    event: impl FnOnce(Info, i64) -> Everyone<'static>,
) {
    if data.is_null() {
        return;
    }
    // SAFETY: as the caller promises.
    let info = unsafe { *data.cast::<Info>() };
    // SAFETY: the server event's context.
    unsafe { guarded(ctx, |ctx| every_kind(ctx, event(info, ctx.wall_ms()))) };
}

/// MODULE UNLOAD: the server refuses it while clients wait or timers are
/// pending, so this only drops what is left, in every kind's machine.
///
/// # Safety
/// `ctx` must be the unload's context.
pub unsafe fn on_unload(ctx: *mut RedisModuleCtx) {
    // SAFETY: as the caller promises.
    unsafe { guarded(ctx, |ctx| every_kind(ctx, Everyone::Unload)) };
}

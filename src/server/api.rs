//! The module API functions the commands use, resolved once at load.
//!
//! The bindings expose every server function as an `Option`, filled in by
//! `RedisModule_Init` from whatever the running server offers. Checking them
//! here, once, means the load fails with a clear log line on a server that
//! lacks one, and the command path never has to unwrap anything.

use std::os::raw::{c_char, c_int, c_long, c_longlong, c_void};
use std::sync::OnceLock;

use redis_module::raw::{
    mstime_t, ustime_t, RedisModuleBlockedClient, RedisModuleCallReply, RedisModuleCmdFunc,
    RedisModuleCtx, RedisModuleDisconnectFunc, RedisModuleKey, RedisModuleString,
    RedisModuleTimerID, RedisModuleTimerProc, RedisModule_AvoidReplicaTraffic,
    RedisModule_BlockClientOnKeys, RedisModule_CachedMicroseconds, RedisModule_Call,
    RedisModule_CloseKey, RedisModule_CreateString, RedisModule_CreateTimer, RedisModule_DeleteKey,
    RedisModule_FreeCallReply, RedisModule_FreeString, RedisModule_GetAbsExpire,
    RedisModule_GetBlockedClientPrivateData, RedisModule_GetContextFlags,
    RedisModule_GetRandomBytes, RedisModule_GetSelectedDb, RedisModule_HashGet,
    RedisModule_HashSet, RedisModule_KeyType, RedisModule_Log, RedisModule_Milliseconds,
    RedisModule_NotifyKeyspaceEvent, RedisModule_OpenKey, RedisModule_Replicate,
    RedisModule_ReplyWithArray, RedisModule_ReplyWithError, RedisModule_ReplyWithLongLong,
    RedisModule_SelectDb, RedisModule_SetAbsExpire, RedisModule_SetDisconnectCallback,
    RedisModule_SetExpire, RedisModule_SignalModifiedKey, RedisModule_StopTimer,
    RedisModule_StringPtrLen, RedisModule_UnblockClient, RedisModule_WrongArity,
};
use redis_module::raw::{
    RedisModule_CallReplyInteger, RedisModule_GetExpire, RedisModule_ReplyWithNull,
    RedisModule_ReplyWithSimpleString, RedisModule_ReplyWithStringBuffer, RedisModule_ValueLength,
    RedisModule_ZsetAdd, RedisModule_ZsetFirstInScoreRange, RedisModule_ZsetLastInScoreRange,
    RedisModule_ZsetRangeCurrentElement, RedisModule_ZsetRangeEndReached,
    RedisModule_ZsetRangeNext, RedisModule_ZsetRangeStop, RedisModule_ZsetRem,
    RedisModule_ZsetScore,
};
use redis_module::raw::{RedisModule_IsKeysPositionRequest, RedisModule_KeyAtPos};

use super::strings::ServerStr;

pub struct Api {
    pub open_key: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *mut RedisModuleString,
        c_int,
    ) -> *mut RedisModuleKey,
    pub close_key: unsafe extern "C" fn(*mut RedisModuleKey),
    pub delete_key: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    pub key_type: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    pub hash_get: unsafe extern "C" fn(*mut RedisModuleKey, c_int, ...) -> c_int,
    pub hash_set: unsafe extern "C" fn(*mut RedisModuleKey, c_int, ...) -> c_int,
    pub string_ptr_len: unsafe extern "C" fn(*const RedisModuleString, *mut usize) -> *const c_char,
    pub create_string:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, usize) -> *mut RedisModuleString,
    pub free_string: unsafe extern "C" fn(*mut RedisModuleCtx, *mut RedisModuleString),
    pub replicate:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, *const c_char, ...) -> c_int,
    pub notify: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        c_int,
        *const c_char,
        *mut RedisModuleString,
    ) -> c_int,
    pub signal_modified_key:
        unsafe extern "C" fn(*mut RedisModuleCtx, *mut RedisModuleString) -> c_int,
    pub set_expire: unsafe extern "C" fn(*mut RedisModuleKey, mstime_t) -> c_int,
    /// Absent on Redis 7.0.0-7.0.4 and 6.2.0-6.2.7 (registered late upstream);
    /// there the relative `set_expire` is the fallback.
    pub set_abs_expire: Option<unsafe extern "C" fn(*mut RedisModuleKey, mstime_t) -> c_int>,
    /// Absent where `set_abs_expire` is.
    pub get_abs_expire: Option<unsafe extern "C" fn(*mut RedisModuleKey) -> mstime_t>,
    pub milliseconds: unsafe extern "C" fn() -> mstime_t,
    /// The server's cached command time (Redis 7.2+, Valkey). It is taken
    /// once per top-level command, so every call in one MULTI/EXEC or script
    /// sees the same instant, the same one the server uses to decide whether
    /// a key has expired. Redis 7.0 lacks it; there `milliseconds` (the real
    /// clock, which also advances inside a transaction) is used.
    pub cached_microseconds: Option<unsafe extern "C" fn() -> ustime_t>,
    pub reply_with_array: unsafe extern "C" fn(*mut RedisModuleCtx, c_long) -> c_int,
    pub reply_with_long_long: unsafe extern "C" fn(*mut RedisModuleCtx, c_longlong) -> c_int,
    pub reply_with_error: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char) -> c_int,
    pub wrong_arity: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    pub log: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, *const c_char, ...),
    // TB.BTAKE: blocking, timers, the client's context.
    pub block_client_on_keys: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        RedisModuleCmdFunc,
        RedisModuleCmdFunc,
        Option<unsafe extern "C" fn(*mut RedisModuleCtx, *mut c_void)>,
        c_longlong,
        *mut *mut RedisModuleString,
        c_int,
        *mut c_void,
    ) -> *mut RedisModuleBlockedClient,
    pub unblock_client: unsafe extern "C" fn(*mut RedisModuleBlockedClient, *mut c_void) -> c_int,
    pub set_disconnect_callback:
        unsafe extern "C" fn(*mut RedisModuleBlockedClient, RedisModuleDisconnectFunc),
    pub blocked_client_private_data: unsafe extern "C" fn(*mut RedisModuleCtx) -> *mut c_void,
    pub create_timer: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        mstime_t,
        RedisModuleTimerProc,
        *mut c_void,
    ) -> RedisModuleTimerID,
    pub stop_timer:
        unsafe extern "C" fn(*mut RedisModuleCtx, RedisModuleTimerID, *mut *mut c_void) -> c_int,
    pub context_flags: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    /// True while the server pauses writes (CLIENT PAUSE WRITE/ALL,
    /// FAILOVER, CLUSTER FAILOVER); present on every server with modules
    /// that can block (6.0+), optional all the same.
    pub avoid_replica_traffic: Option<unsafe extern "C" fn() -> c_int>,
    pub selected_db: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    pub select_db: unsafe extern "C" fn(*mut RedisModuleCtx, c_int) -> c_int,
    pub call: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *const c_char,
        *const c_char,
        ...
    ) -> *mut RedisModuleCallReply,
    pub free_call_reply: unsafe extern "C" fn(*mut RedisModuleCallReply),
    /// The bucket's field names as server strings, made once here: passing
    /// C strings instead (`REDISMODULE_HASH_CFIELDS`, the `c` format of
    /// `RM_Replicate`) makes the server allocate and free a string object per
    /// name on every call.
    pub tokens_field: FieldName,
    pub last_refill_field: FieldName,
    /// Leases (src/lease/set.rs): the sorted-set functions, and the name of
    /// the bookkeeping member, made once like the field names.
    pub zset: Zset,
    pub seq_member: FieldName,
    /// The member holding a lease set's incarnation (core/src/lease.rs,
    /// `Incarnation`).
    pub inc_member: FieldName,
    /// The server's random source (SHA1 in counter mode, seeded from
    /// /dev/urandom at startup): a new lease set's incarnation.
    pub random_bytes: unsafe extern "C" fn(*mut u8, usize),
    pub get_expire: unsafe extern "C" fn(*mut RedisModuleKey) -> mstime_t,
    pub call_reply_integer: unsafe extern "C" fn(*mut RedisModuleCallReply) -> c_longlong,
    pub reply_with_null: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    pub reply_with_simple_string: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char) -> c_int,
    pub reply_with_string_buffer:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, usize) -> c_int,
    /// TB.TAKEALL names its keys itself (`getkeys-api`): its options
    /// follow the groups, where a key range would misread them.
    pub is_keys_position_request: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    pub key_at_pos: unsafe extern "C" fn(*mut RedisModuleCtx, c_int),
}

/// The sorted-set part of the API.
pub struct Zset {
    pub length: unsafe extern "C" fn(*mut RedisModuleKey) -> usize,
    pub add:
        unsafe extern "C" fn(*mut RedisModuleKey, f64, *mut RedisModuleString, *mut c_int) -> c_int,
    pub rem: unsafe extern "C" fn(*mut RedisModuleKey, *mut RedisModuleString, *mut c_int) -> c_int,
    pub score: unsafe extern "C" fn(*mut RedisModuleKey, *mut RedisModuleString, *mut f64) -> c_int,
    pub first_in_score_range:
        unsafe extern "C" fn(*mut RedisModuleKey, f64, f64, c_int, c_int) -> c_int,
    pub last_in_score_range:
        unsafe extern "C" fn(*mut RedisModuleKey, f64, f64, c_int, c_int) -> c_int,
    pub range_current_element:
        unsafe extern "C" fn(*mut RedisModuleKey, *mut f64) -> *mut RedisModuleString,
    pub range_next: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    pub range_end_reached: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    pub range_stop: unsafe extern "C" fn(*mut RedisModuleKey),
}

/// A server string created at load and never freed.
#[derive(Clone, Copy)]
pub struct FieldName(*mut RedisModuleString);

impl FieldName {
    /// The name, to pass where a server string is wanted.
    #[inline]
    pub fn get(&self) -> &ServerStr {
        // SAFETY: made non-null at load and never freed.
        unsafe { ServerStr::at(&self.0) }
    }
}

// SAFETY: the string is created once, before any command runs, and is only
// ever used (read, or its reference count briefly raised by RM_Replicate) by
// commands, which the server runs on its main thread one at a time.
unsafe impl Send for FieldName {}
unsafe impl Sync for FieldName {}

static API: OnceLock<Api> = OnceLock::new();

/// The resolved API, or `None` before a successful load.
pub fn api() -> Option<&'static Api> {
    API.get()
}

/// Resolves every function; on failure, returns the name of the first one
/// this server does not provide.
///
/// # Safety
/// Must run after `RedisModule_Init` (which fills in the pointers), on the
/// main thread, as `RedisModule_OnLoad` does.
pub unsafe fn resolve() -> Result<&'static Api, &'static str> {
    if let Some(api) = API.get() {
        return Ok(api);
    }
    macro_rules! need {
        ($name:ident) => {
            $name.ok_or(stringify!($name))?
        };
    }
    let create_string = need!(RedisModule_CreateString);
    // A NULL context: the strings are not tied to a command and live on.
    let field = |name: &'static str| {
        let string = create_string(std::ptr::null_mut(), name.as_ptr().cast(), name.len());
        if string.is_null() {
            Err("RedisModule_CreateString")
        } else {
            Ok(FieldName(string))
        }
    };
    let api = Api {
        open_key: need!(RedisModule_OpenKey),
        close_key: need!(RedisModule_CloseKey),
        delete_key: need!(RedisModule_DeleteKey),
        key_type: need!(RedisModule_KeyType),
        hash_get: need!(RedisModule_HashGet),
        hash_set: need!(RedisModule_HashSet),
        string_ptr_len: need!(RedisModule_StringPtrLen),
        create_string,
        free_string: need!(RedisModule_FreeString),
        replicate: need!(RedisModule_Replicate),
        notify: need!(RedisModule_NotifyKeyspaceEvent),
        signal_modified_key: need!(RedisModule_SignalModifiedKey),
        set_expire: need!(RedisModule_SetExpire),
        set_abs_expire: RedisModule_SetAbsExpire,
        get_abs_expire: RedisModule_GetAbsExpire,
        milliseconds: need!(RedisModule_Milliseconds),
        cached_microseconds: RedisModule_CachedMicroseconds,
        reply_with_array: need!(RedisModule_ReplyWithArray),
        reply_with_long_long: need!(RedisModule_ReplyWithLongLong),
        reply_with_error: need!(RedisModule_ReplyWithError),
        wrong_arity: need!(RedisModule_WrongArity),
        log: need!(RedisModule_Log),
        block_client_on_keys: need!(RedisModule_BlockClientOnKeys),
        unblock_client: need!(RedisModule_UnblockClient),
        set_disconnect_callback: need!(RedisModule_SetDisconnectCallback),
        blocked_client_private_data: need!(RedisModule_GetBlockedClientPrivateData),
        create_timer: need!(RedisModule_CreateTimer),
        stop_timer: need!(RedisModule_StopTimer),
        context_flags: need!(RedisModule_GetContextFlags),
        avoid_replica_traffic: RedisModule_AvoidReplicaTraffic,
        selected_db: need!(RedisModule_GetSelectedDb),
        select_db: need!(RedisModule_SelectDb),
        call: need!(RedisModule_Call),
        free_call_reply: need!(RedisModule_FreeCallReply),
        tokens_field: field("tokens")?,
        last_refill_field: field("last_refill")?,
        zset: Zset {
            length: need!(RedisModule_ValueLength),
            add: need!(RedisModule_ZsetAdd),
            rem: need!(RedisModule_ZsetRem),
            score: need!(RedisModule_ZsetScore),
            first_in_score_range: need!(RedisModule_ZsetFirstInScoreRange),
            last_in_score_range: need!(RedisModule_ZsetLastInScoreRange),
            range_current_element: need!(RedisModule_ZsetRangeCurrentElement),
            range_next: need!(RedisModule_ZsetRangeNext),
            range_end_reached: need!(RedisModule_ZsetRangeEndReached),
            range_stop: need!(RedisModule_ZsetRangeStop),
        },
        seq_member: field("seq")?,
        inc_member: field("inc")?,
        random_bytes: need!(RedisModule_GetRandomBytes),
        get_expire: need!(RedisModule_GetExpire),
        call_reply_integer: need!(RedisModule_CallReplyInteger),
        reply_with_null: need!(RedisModule_ReplyWithNull),
        reply_with_simple_string: need!(RedisModule_ReplyWithSimpleString),
        reply_with_string_buffer: need!(RedisModule_ReplyWithStringBuffer),
        is_keys_position_request: need!(RedisModule_IsKeysPositionRequest),
        key_at_pos: need!(RedisModule_KeyAtPos),
    };
    Ok(API.get_or_init(|| api))
}

impl Api {
    /// The wall clock in Unix ms, read now: TB.BTAKE serves waiters from
    /// timers and callbacks, where the cached command time may be stale.
    pub fn wall_ms(&self) -> i64 {
        // SAFETY: a plain server function without arguments.
        unsafe { (self.milliseconds)() }
    }

    /// The current Unix time in ms, as the server sees it for this command.
    pub fn now_ms(&self) -> i64 {
        // SAFETY: plain server functions without arguments.
        match self.cached_microseconds {
            Some(cached) => (unsafe { cached() }).div_euclid(1000),
            None => unsafe { (self.milliseconds)() },
        }
    }

    /// 64 bits from the server's random source.
    pub fn random_u64(&self) -> u64 {
        let mut bytes = [0u8; 8];
        // SAFETY: the buffer holds exactly the 8 bytes asked for.
        unsafe { (self.random_bytes)(bytes.as_mut_ptr(), bytes.len()) };
        u64::from_le_bytes(bytes)
    }

    /// Writes `message` to the server log at `level` ("warning", "notice").
    pub fn log(&self, ctx: *mut RedisModuleCtx, level: &std::ffi::CStr, message: &str) {
        write_log(self.log, ctx, level, message);
    }
}

/// Writes `message` to the server log through `log` (RM_Log), also before
/// the API is resolved (the load hook reports its failures this way).
pub fn write_log(
    log: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, *const c_char, ...),
    ctx: *mut RedisModuleCtx,
    level: &std::ffi::CStr,
    message: &str,
) {
    // A message with an interior NUL is cut there rather than dropped.
    let text = message.split('\0').next().unwrap_or_default();
    if let Ok(text) = std::ffi::CString::new(text) {
        // SAFETY: all pointers are valid NUL-terminated strings; a null ctx
        // is allowed by RM_Log.
        unsafe { log(ctx, level.as_ptr(), c"%s".as_ptr(), text.as_ptr()) };
    }
}

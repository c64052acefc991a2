//! [`Context`]: what a handler (or a wait's callback) may ask of the server,
//! as safe calls on the command's context: open a key (keys.rs), make a
//! string, replicate an effect, notify a keyspace event, signal WATCH,
//! read the clock, log. Every call is a thin, inlined wrapper of one module
//! API function; nothing allocates that the raw call did not.
//!
//! What is replicated, notified or written is the caller's business: these
//! wrappers know keys, hashes, sorted sets and strings, never a bucket or a
//! lease.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_longlong};

use redis_module::raw::{
    RedisModuleCtx, RedisModuleString, REDISMODULE_NOTIFY_GENERIC, REDISMODULE_NOTIFY_HASH,
    REDISMODULE_NOTIFY_ZSET,
};
use redis_tb_core::error::TbError;
use redis_tb_core::number::format_integer;
use redis_tb_core::wait::Db;

use super::api::Api;
use super::keys::{self, Access, Key, KeyType};
use super::strings::{ServerStr, ServerString};

/// The server's context of one command or callback, good for `'a`: a
/// handler gets one and cannot keep it past its return.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    api: &'static Api,
    ptr: *mut RedisModuleCtx,
    live: PhantomData<&'a ()>,
}

/// A keyspace event's class (`REDISMODULE_NOTIFY_*`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Notify {
    Generic,
    Hash,
    Zset,
}

impl<'a> Context<'a> {
    /// # Safety
    /// `ptr` must be a live context of the server for all of `'a`.
    #[inline]
    pub(super) unsafe fn new(api: &'static Api, ptr: *mut RedisModuleCtx) -> Self {
        Context {
            api,
            ptr,
            live: PhantomData,
        }
    }

    #[inline]
    pub(super) fn ptr(&self) -> *mut RedisModuleCtx {
        self.ptr
    }

    /// The resolved server API (its functions are `unsafe` to call: they
    /// are for server/; its field names are for everyone).
    #[inline]
    pub fn api(&self) -> &'static Api {
        self.api
    }

    /// The current Unix time in ms, as the server sees it for this command
    /// (`Api::now_ms`): the one clock the handlers read.
    #[inline]
    pub fn now_ms(&self) -> i64 {
        self.api.now_ms()
    }

    /// The wall clock in Unix ms, read now (`Api::wall_ms`).
    #[inline]
    pub fn wall_ms(&self) -> i64 {
        self.api.wall_ms()
    }

    /// 64 bits from the server's random source.
    #[inline]
    pub fn random_u64(&self) -> u64 {
        self.api.random_u64()
    }

    /// The database the context is on.
    #[inline]
    pub fn selected_db(&self) -> Db {
        // SAFETY: a live context.
        unsafe { (self.api.selected_db)(self.ptr) }
    }

    /// Writes `message` to the server log as a warning.
    pub fn warn(&self, message: &str) {
        self.api.log(self.ptr, c"warning", message);
    }

    /// Opens `name` for `access`; see [`keys::open`].
    #[inline]
    pub fn open(
        &self,
        name: &ServerStr,
        access: Access,
        wanted: KeyType,
    ) -> Result<Option<Key<'a>>, TbError> {
        keys::open(*self, name, access, wanted)
    }

    /// A new server string holding a copy of `bytes`, `None` if the server
    /// could not make one.
    #[inline]
    pub fn string(&self, bytes: &[u8]) -> Option<ServerString<'a>> {
        // SAFETY: a live context; the server copies the bytes, and the new
        // string is this module's to free.
        unsafe {
            let ptr = (self.api.create_string)(self.ptr, bytes.as_ptr().cast(), bytes.len());
            ServerString::owned(*self, ptr)
        }
    }

    /// Replicates `command key args...` (to replicas and the AOF, wrapped
    /// with the command's other effects in MULTI/EXEC). Up to ten `args`
    /// are passed one by one (the `s` format: no allocation in the
    /// server); more, as one vector.
    #[inline]
    pub fn replicate<const N: usize>(
        &self,
        command: &CStr,
        key: &ServerStr,
        args: [&ServerStr; N],
    ) {
        let (api, ctx, cmd, k) = (self.api, self.ptr, command.as_ptr(), key.ptr());
        macro_rules! each {
            ($format:literal $(, $arg:ident)*) => {
                // SAFETY: a live context and strings, one `s` per string.
                unsafe { (api.replicate)(ctx, cmd, $format.as_ptr(), k $(, $arg.ptr())*) }
            };
        }
        match args.as_slice() {
            [] => each!(c"s"),
            [a] => each!(c"ss", a),
            [a, b] => each!(c"sss", a, b),
            [a, b, c] => each!(c"ssss", a, b, c),
            [a, b, c, d] => each!(c"sssss", a, b, c, d),
            [a, b, c, d, e] => each!(c"ssssss", a, b, c, d, e),
            [a, b, c, d, e, f] => each!(c"sssssss", a, b, c, d, e, f),
            [a, b, c, d, e, f, g] => each!(c"ssssssss", a, b, c, d, e, f, g),
            [a, b, c, d, e, f, g, h] => each!(c"sssssssss", a, b, c, d, e, f, g, h),
            [a, b, c, d, e, f, g, h, i] => each!(c"ssssssssss", a, b, c, d, e, f, g, h, i),
            [a, b, c, d, e, f, g, h, i, j] => {
                each!(c"sssssssssss", a, b, c, d, e, f, g, h, i, j)
            }
            _ => {
                let mut argv = args.map(|arg| arg.ptr());
                // SAFETY: a live context; `v` is a pointer to `len` strings.
                unsafe {
                    (api.replicate)(ctx, cmd, c"sv".as_ptr(), k, argv.as_mut_ptr(), argv.len())
                }
            }
        };
    }

    /// Replicates `command key members...` for any number of members, as
    /// one vector (`sv`).
    pub fn replicate_list<'s>(
        &self,
        command: &CStr,
        key: &ServerStr,
        members: impl IntoIterator<Item = &'s ServerStr>,
    ) {
        let mut argv: Vec<*mut RedisModuleString> =
            members.into_iter().map(ServerStr::ptr).collect();
        // SAFETY: a live context; `v` is a pointer to `len` strings.
        unsafe {
            (self.api.replicate)(
                self.ptr,
                command.as_ptr(),
                c"sv".as_ptr(),
                key.ptr(),
                argv.as_mut_ptr(),
                argv.len(),
            )
        };
    }

    /// Replicates `command key value` with an integer value (`sl`), such as
    /// `PEXPIREAT key ms`.
    #[inline]
    pub fn replicate_integer(&self, command: &CStr, key: &ServerStr, value: i64) {
        // SAFETY: a live context and key name; `l` is a long long.
        unsafe {
            (self.api.replicate)(
                self.ptr,
                command.as_ptr(),
                c"sl".as_ptr(),
                key.ptr(),
                value as c_longlong,
            )
        };
    }

    /// Replicates `command key score member [score member ...]` (ZADD's
    /// shape): up to three pairs with integer scores passed as such (`ls`),
    /// more as one vector of strings made here.
    pub fn replicate_scored(
        &self,
        command: &CStr,
        key: &ServerStr,
        pairs: &[(i64, &ServerStr)],
    ) -> Result<(), TbError> {
        let (api, ctx, cmd, k) = (self.api, self.ptr, command.as_ptr(), key.ptr());
        // SAFETY (each arm): a live context and strings; `l` a long long.
        match pairs {
            [(s1, m1)] => unsafe {
                (api.replicate)(ctx, cmd, c"sls".as_ptr(), k, *s1 as c_longlong, m1.ptr());
            },
            [(s1, m1), (s2, m2)] => unsafe {
                (api.replicate)(
                    ctx,
                    cmd,
                    c"slsls".as_ptr(),
                    k,
                    *s1 as c_longlong,
                    m1.ptr(),
                    *s2 as c_longlong,
                    m2.ptr(),
                );
            },
            [(s1, m1), (s2, m2), (s3, m3)] => unsafe {
                (api.replicate)(
                    ctx,
                    cmd,
                    c"slslsls".as_ptr(),
                    k,
                    *s1 as c_longlong,
                    m1.ptr(),
                    *s2 as c_longlong,
                    m2.ptr(),
                    *s3 as c_longlong,
                    m3.ptr(),
                );
            },
            _ => {
                let scores = pairs
                    .iter()
                    .map(|(score, _)| self.string(format_integer(*score).as_bytes()))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(TbError::Internal)?;
                let mut argv = Vec::with_capacity(pairs.len().saturating_mul(2));
                for (score, (_, member)) in scores.iter().zip(pairs) {
                    argv.extend([score.ptr(), member.ptr()]);
                }
                // SAFETY: a live context; `v` is a pointer to `len` strings.
                unsafe {
                    (api.replicate)(ctx, cmd, c"sv".as_ptr(), k, argv.as_mut_ptr(), argv.len())
                };
            }
        }
        Ok(())
    }

    /// Tells keyspace listeners about `event` on `key`.
    #[inline]
    pub fn notify(&self, class: Notify, event: &CStr, key: &ServerStr) {
        let class = match class {
            Notify::Generic => REDISMODULE_NOTIFY_GENERIC,
            Notify::Hash => REDISMODULE_NOTIFY_HASH,
            Notify::Zset => REDISMODULE_NOTIFY_ZSET,
        };
        // SAFETY: a live context, a NUL-terminated event name, a key name.
        unsafe { (self.api.notify)(self.ptr, class as c_int, event.as_ptr(), key.ptr()) };
    }

    /// Tells WATCH and client tracking that `key` changed (the module opts
    /// out of the implicit signal on every write-open: `set_module_options`
    /// in load.rs).
    #[inline]
    pub fn signal_modified(&self, key: &ServerStr) {
        // SAFETY: a live context and key name.
        unsafe { (self.api.signal_modified_key)(self.ptr, key.ptr()) };
    }

    /// `ZCOUNT key min max` through the server (`RM_Call`), read-only:
    /// `None` if the call failed (the command renamed or disabled).
    pub fn zcount(&self, key: &ServerStr, min: &ServerStr, max: &CStr) -> Option<i64> {
        // SAFETY: a live context and strings; the reply is freed here.
        unsafe {
            let reply = (self.api.call)(
                self.ptr,
                c"ZCOUNT".as_ptr(),
                c"ssc".as_ptr(),
                key.ptr(),
                min.ptr(),
                max.as_ptr(),
            );
            if reply.is_null() {
                return None;
            }
            let count = (self.api.call_reply_integer)(reply);
            (self.api.free_call_reply)(reply);
            Some(count)
        }
    }

    /// Whether the server only asks the command for its keys
    /// (`getkeys-api`: cluster routing, COMMAND GETKEYS).
    #[inline]
    pub fn is_keys_position_request(&self) -> bool {
        // SAFETY: a live context.
        unsafe { (self.api.is_keys_position_request)(self.ptr) != 0 }
    }

    /// Names `args[position]` as a key, in answer to a keys-position
    /// request; `args` are the command's arguments as the handler got them
    /// (the server reads argv at the position, so it must be within them).
    pub fn key_at_pos(&self, args: &[ServerStr], position: usize) {
        if position >= args.len() {
            return;
        }
        let Ok(position) = c_int::try_from(position) else {
            return;
        };
        // SAFETY: a live context; the position is within argv.
        unsafe { (self.api.key_at_pos)(self.ptr, position) };
    }
}

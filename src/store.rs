//! A bucket's hash in the keyspace: type check, read, write with an
//! absolute deadline, and propagation of the effects.
//!
//! Layout (shared with the Lua script it replaces, so either can take over
//! from the other): a hash with `tokens` (decimal text) and `last_refill`
//! (integer Unix ms), other fields left alone, and a TTL that ends exactly
//! when the bucket is full again.

use std::os::raw::c_int;
use std::ptr;

use redis_module::raw::{
    RedisModuleCtx, RedisModuleKey, RedisModuleString, REDISMODULE_HASH_NONE,
    REDISMODULE_KEYTYPE_EMPTY, REDISMODULE_KEYTYPE_HASH, REDISMODULE_NOTIFY_GENERIC,
    REDISMODULE_NOTIFY_HASH, REDISMODULE_READ, REDISMODULE_WRITE,
};

use crate::api::Api;
use crate::bucket::State;
use crate::error::TbError;
use crate::number::{format_integer, format_tokens, parse_decimal, Sign};

/// The key holds a hash that is not a bucket: `tokens` or `last_refill` is
/// missing or not a finite number. The caller names the key in its error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrupt;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// An open bucket key; closed when dropped.
pub struct BucketKey<'a> {
    api: &'a Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: *mut RedisModuleKey,
}

impl<'a> BucketKey<'a> {
    /// Opens `name` and checks that it is empty or a hash, so a WRONGTYPE
    /// error is given before anything is touched.
    ///
    /// # Safety
    /// `ctx` and `name` must be the command's live context and argument.
    pub unsafe fn open(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        access: Access,
    ) -> Result<Self, TbError> {
        let mode = match access {
            Access::Read => REDISMODULE_READ,
            Access::Write => REDISMODULE_READ | REDISMODULE_WRITE,
        };
        let key = (api.open_key)(ctx, name, mode as c_int);
        let bucket = BucketKey {
            api,
            ctx,
            name,
            key,
        };
        // A read-only open of a missing key gives NULL, which is simply an
        // empty bucket.
        if key.is_null() {
            return Ok(bucket);
        }
        match (api.key_type)(key) as isize {
            REDISMODULE_KEYTYPE_EMPTY | REDISMODULE_KEYTYPE_HASH => Ok(bucket),
            _ => Err(TbError::WrongType),
        }
    }

    /// The stored state, `None` for a missing key (a full bucket), or
    /// `Corrupt` if the hash lacks a readable `tokens` or `last_refill`.
    pub fn read(&self) -> Result<Option<State>, Corrupt> {
        // SAFETY: `key` is open (or null, checked first).
        if self.key.is_null()
            || unsafe { (self.api.key_type)(self.key) } as isize == REDISMODULE_KEYTYPE_EMPTY
        {
            return Ok(None);
        }
        let mut tokens: *mut RedisModuleString = ptr::null_mut();
        let mut last_refill: *mut RedisModuleString = ptr::null_mut();
        // SAFETY: field names (server strings), each followed by an
        // out-pointer, and a NULL terminator. Missing fields come back NULL.
        unsafe {
            (self.api.hash_get)(
                self.key,
                REDISMODULE_HASH_NONE as c_int,
                self.api.tokens_field.0,
                &mut tokens as *mut *mut RedisModuleString,
                self.api.last_refill_field.0,
                &mut last_refill as *mut *mut RedisModuleString,
                ptr::null::<RedisModuleString>(),
            );
        }
        let tokens = OwnedString::new(self.api, self.ctx, tokens);
        let last_refill = OwnedString::new(self.api, self.ctx, last_refill);
        let state = State {
            tokens: tokens.number().ok_or(Corrupt)?,
            last_refill_ms: last_refill.number().ok_or(Corrupt)?,
        };
        Ok(Some(state))
    }

    /// Stores `state` and makes the key expire at `deadline_ms` (absolute),
    /// then propagates exactly these effects.
    ///
    /// Replicas and the AOF get `HSET` and `PEXPIREAT` with the values
    /// computed here, never the TB.TAKE command: replaying the command would
    /// refill with another clock and another result. The absolute deadline
    /// is computed once, so the master, its replicas and a reloaded AOF all
    /// expire the key at the same millisecond. Redis wraps the two commands
    /// in MULTI/EXEC, so a replica never sees one without the other.
    pub fn write(&self, state: &State, now_ms: i64, deadline_ms: i64) {
        let api = self.api;
        let text = format_tokens(state.tokens);
        let bytes = text.as_bytes();
        // SAFETY: ctx/name/key are live for this command; strings created
        // here are freed by OwnedString before returning.
        unsafe {
            let tokens = OwnedString::new(
                api,
                self.ctx,
                (api.create_string)(self.ctx, bytes.as_ptr().cast(), bytes.len()),
            );
            // Formatted here rather than by RM_CreateStringFromLongLong,
            // which costs twice as much for the same text.
            let now_text = format_integer(now_ms);
            let now_bytes = now_text.as_bytes();
            let last_refill = OwnedString::new(
                api,
                self.ctx,
                (api.create_string)(self.ctx, now_bytes.as_ptr().cast(), now_bytes.len()),
            );
            (api.hash_set)(
                self.key,
                REDISMODULE_HASH_NONE as c_int,
                api.tokens_field.0,
                tokens.ptr,
                api.last_refill_field.0,
                last_refill.ptr,
                ptr::null::<RedisModuleString>(),
            );
            // The TTL can only be set once the hash exists.
            match api.set_abs_expire {
                Some(set_abs_expire) => set_abs_expire(self.key, deadline_ms),
                None => (api.set_expire)(self.key, deadline_ms.saturating_sub(now_ms).max(1)),
            };
            (api.replicate)(
                self.ctx,
                c"HSET".as_ptr(),
                c"sssss".as_ptr(),
                self.name,
                api.tokens_field.0,
                tokens.ptr,
                api.last_refill_field.0,
                last_refill.ptr,
            );
            (api.replicate)(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.name,
                deadline_ms as std::os::raw::c_longlong,
            );
            (api.notify)(
                self.ctx,
                REDISMODULE_NOTIFY_HASH,
                c"hset".as_ptr(),
                self.name,
            );
            (api.notify)(
                self.ctx,
                REDISMODULE_NOTIFY_GENERIC,
                c"expire".as_ptr(),
                self.name,
            );
            // The module opts out of the implicit "modified" signal on every
            // write-open (see lib.rs), so WATCH and client tracking are told
            // here, only when the bucket really changed.
            (api.signal_modified_key)(self.ctx, self.name);
        }
    }
}

impl Drop for BucketKey<'_> {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: opened by `open`, closed exactly once.
            unsafe { (self.api.close_key)(self.key) };
        }
    }
}

/// A server string this module created or was handed ownership of.
struct OwnedString<'a> {
    api: &'a Api,
    ctx: *mut RedisModuleCtx,
    ptr: *mut RedisModuleString,
}

impl<'a> OwnedString<'a> {
    fn new(api: &'a Api, ctx: *mut RedisModuleCtx, ptr: *mut RedisModuleString) -> Self {
        OwnedString { api, ctx, ptr }
    }

    /// The value as a finite number, `None` if absent or not a number.
    fn number(&self) -> Option<f64> {
        if self.ptr.is_null() {
            return None;
        }
        // SAFETY: a live string owned by self.
        parse_decimal(unsafe { self.api.bytes(self.ptr) }, Sign::Allowed)
    }
}

impl Drop for OwnedString<'_> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: created for or handed to this module, freed once.
            unsafe { (self.api.free_string)(self.ctx, self.ptr) };
        }
    }
}

//! Key access both data types share: opening a key with its type checked
//! ([`open_key`]), read or write ([`Access`]), and server strings that free
//! themselves ([`ServerString`]).

use std::os::raw::c_int;

use redis_module::raw::{
    RedisModuleCtx, RedisModuleKey, RedisModuleString, REDISMODULE_KEYTYPE_EMPTY, REDISMODULE_READ,
    REDISMODULE_WRITE,
};
use redis_tb_core::error::TbError;

use super::api::Api;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Opens `name` and checks that it is missing or of the type `wanted` (a
/// `REDISMODULE_KEYTYPE_*`), so WRONGTYPE is answered before anything is
/// touched; on that error the key is closed again. The key is null when a
/// read-only open finds nothing: simply an empty bucket or lease set.
///
/// # Safety
/// `ctx` and `name` must be a live context and key name.
pub unsafe fn open_key(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    access: Access,
    wanted: isize,
) -> Result<*mut RedisModuleKey, TbError> {
    let mode = match access {
        Access::Read => REDISMODULE_READ,
        Access::Write => REDISMODULE_READ | REDISMODULE_WRITE,
    };
    let key = (api.open_key)(ctx, name, mode as c_int);
    if key.is_null() {
        return Ok(key);
    }
    match (api.key_type)(key) as isize {
        kind if kind == REDISMODULE_KEYTYPE_EMPTY || kind == wanted => Ok(key),
        _ => {
            (api.close_key)(key);
            Err(TbError::WrongType)
        }
    }
}

/// A server string this module created or was handed ownership of; freed
/// when dropped.
pub struct ServerString<'a> {
    api: &'a Api,
    ctx: *mut RedisModuleCtx,
    ptr: *mut RedisModuleString,
}

impl<'a> ServerString<'a> {
    fn new(api: &'a Api, ctx: *mut RedisModuleCtx, ptr: *mut RedisModuleString) -> Self {
        ServerString { api, ctx, ptr }
    }

    /// A copy of `bytes`; null if the server could not make one.
    pub fn from_bytes(api: &'a Api, ctx: *mut RedisModuleCtx, bytes: &[u8]) -> Self {
        // SAFETY: a live context; the bytes are copied by the server.
        let ptr = unsafe { (api.create_string)(ctx, bytes.as_ptr().cast(), bytes.len()) };
        ServerString::new(api, ctx, ptr)
    }

    /// A copy of `bytes` (a key name), or `None` if the server could not
    /// make one.
    pub fn copy(api: &'a Api, ctx: *mut RedisModuleCtx, bytes: &[u8]) -> Option<Self> {
        let string = ServerString::from_bytes(api, ctx, bytes);
        (!string.ptr.is_null()).then_some(string)
    }

    /// Takes ownership of a string the server handed over (may be null).
    pub fn owned(api: &'a Api, ctx: *mut RedisModuleCtx, ptr: *mut RedisModuleString) -> Self {
        ServerString::new(api, ctx, ptr)
    }

    pub fn ptr(&self) -> *mut RedisModuleString {
        self.ptr
    }

    pub fn bytes(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: a live string owned by self, borrowed with it.
        unsafe { self.api.bytes(&self.ptr) }
    }
}

impl Drop for ServerString<'_> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: created for or handed to this module, freed once.
            unsafe { (self.api.free_string)(self.ctx, self.ptr) };
        }
    }
}

//! A bucket's hash in the keyspace: type check, read, write with an
//! absolute deadline, propagation of the effects, and `write_all`, which
//! writes several buckets all or nothing.
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
    REDISMODULE_NOTIFY_HASH, REDISMODULE_NO_EXPIRE, REDISMODULE_OK,
};

use redis_tb_core::bucket::{self, Outcome, State};
use redis_tb_core::error::TbError;
use redis_tb_core::number::{format_integer, format_tokens, parse_decimal, Sign};

use crate::server::api::Api;
use crate::server::keys::{open_key, Access, ServerString};
use crate::server::metrics;
use crate::testing::fault;

/// The key holds a hash that is not a bucket: `tokens` or `last_refill` is
/// missing or not a finite number. The caller names the key in its error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrupt;

/// An open bucket key; closed when dropped.
pub struct BucketKey<'a> {
    api: &'a Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: *mut RedisModuleKey,
    /// The `tokens` and `last_refill` values as read, kept until the key is
    /// closed so that a write that fails half way can put them back.
    prior: Option<(ServerString<'a>, ServerString<'a>)>,
    /// No bucket was there when read: a write creates one.
    was_missing: bool,
}

/// A write that reached the keyspace but not yet replicas, the AOF or
/// anyone watching: `propagate` tells them, `rollback` takes it back.
pub struct Applied<'a> {
    tokens: ServerString<'a>,
    last_refill: ServerString<'a>,
    deadline_ms: i64,
}

/// A key's expiry before a write, so a rollback can put it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    At(i64),
    Never,
    /// The server cannot tell (`RM_GetAbsExpire` is missing before 7.0.5).
    Unknown,
}

/// The server refused to store a bucket (`RM_HashSet` or setting the
/// expiry failed). The key is as it was and nothing was propagated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteFailed;

impl<'a> BucketKey<'a> {
    /// Opens `name`, empty or a hash (see [`open_key`]).
    ///
    /// # Safety
    /// `ctx` and `name` must be the command's live context and argument.
    pub unsafe fn open(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        access: Access,
    ) -> Result<Self, TbError> {
        Ok(BucketKey {
            api,
            ctx,
            name,
            key: open_key(api, ctx, name, access, REDISMODULE_KEYTYPE_HASH)?,
            prior: None,
            was_missing: false,
        })
    }

    /// The stored state, `None` for a missing key (a full bucket), or
    /// `Corrupt` if the hash lacks a readable `tokens` or `last_refill`.
    pub fn read(&mut self) -> Result<Option<State>, Corrupt> {
        self.was_missing = self.is_empty();
        if self.was_missing {
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
        let tokens = ServerString::owned(self.api, self.ctx, tokens);
        let last_refill = ServerString::owned(self.api, self.ctx, last_refill);
        let state = match (number(&tokens), number(&last_refill)) {
            (Some(tokens), Some(last_refill_ms)) => State {
                tokens,
                last_refill_ms,
            },
            _ => return Err(Corrupt),
        };
        self.prior = Some((tokens, last_refill));
        Ok(Some(state))
    }

    /// The key holds something (a bucket, as `open` checked the type).
    pub fn exists(&self) -> bool {
        !self.is_empty()
    }

    fn is_empty(&self) -> bool {
        // SAFETY: `key` is open (or null, checked first).
        self.key.is_null()
            || unsafe { (self.api.key_type)(self.key) } as isize == REDISMODULE_KEYTYPE_EMPTY
    }

    /// Stores `state` in the keyspace and makes the key expire at
    /// `deadline_ms` (absolute), without telling anyone yet: if either step
    /// fails, the key is put back as it was and `WriteFailed` returned, so
    /// nothing the master does not hold can ever reach a replica.
    pub fn apply(
        &self,
        state: &State,
        now_ms: i64,
        deadline_ms: i64,
    ) -> Result<Applied<'a>, WriteFailed> {
        let text = format_tokens(state.tokens);
        // Formatted here rather than by RM_CreateStringFromLongLong, which
        // costs twice as much for the same text.
        let now_text = format_integer(now_ms);
        let tokens = self.create_string(text.as_bytes());
        let last_refill = self.create_string(now_text.as_bytes());
        if tokens.ptr().is_null() || last_refill.ptr().is_null() {
            return Err(WriteFailed);
        }
        // RM_HashSet checks everything before it changes anything, so a
        // refusal leaves the key as it was. Faults are injected here, once
        // per step, and never into `restore_fields`: the undo must run as
        // it would in production.
        if fault::injected(fault::Step::HashSet) || !self.set_fields(&tokens, &last_refill) {
            return Err(WriteFailed);
        }
        // The TTL can only be set once the hash exists.
        if fault::injected(fault::Step::Expire) || !self.set_deadline(now_ms, deadline_ms) {
            self.restore_fields();
            return Err(WriteFailed);
        }
        Ok(Applied {
            tokens,
            last_refill,
            deadline_ms,
        })
    }

    /// Takes back an applied write that will not be propagated (another
    /// bucket of the same TB.TAKEALL failed to store): the fields as they
    /// were read, and the expiry `prior_expiry` recorded before the write.
    pub fn rollback(&self, applied: Applied<'a>, prior_expiry: Expiry) {
        drop(applied);
        self.restore_fields();
        if self.prior.is_none() {
            return; // the key was deleted: no expiry to put back
        }
        let restored = match (prior_expiry, self.api.set_abs_expire) {
            // SAFETY: the key is open for writing and holds the hash.
            (Expiry::At(deadline_ms), Some(set_abs_expire)) => unsafe {
                set_abs_expire(self.key, deadline_ms) == REDISMODULE_OK as c_int
            },
            (Expiry::Never, Some(set_abs_expire)) => unsafe {
                set_abs_expire(self.key, REDISMODULE_NO_EXPIRE as i64) == REDISMODULE_OK as c_int
            },
            _ => false,
        };
        if !restored {
            self.warn_not_restored();
        }
    }

    /// The key's expiry as it stands, for `rollback`.
    pub fn expiry(&self) -> Expiry {
        match self.api.get_abs_expire {
            _ if self.key.is_null() => Expiry::Never,
            // SAFETY: `key` is open.
            Some(get_abs_expire) => match unsafe { get_abs_expire(self.key) } {
                deadline_ms if deadline_ms >= 0 => Expiry::At(deadline_ms),
                _ => Expiry::Never,
            },
            None => Expiry::Unknown,
        }
    }

    /// Tells replicas, the AOF, keyspace listeners, WATCH and client
    /// tracking about an applied write.
    ///
    /// Replicas and the AOF get `HSET` and `PEXPIREAT` with the values
    /// computed here, never the TB.TAKE command: replaying the command would
    /// refill with another clock and another result. The absolute deadline
    /// is computed once, so the master, its replicas and a reloaded AOF all
    /// expire the key at the same millisecond. Redis wraps the two commands
    /// in MULTI/EXEC, so a replica never sees one without the other.
    pub fn propagate(&self, applied: &Applied<'a>) {
        if self.was_missing {
            metrics::BUCKETS_CREATED.bump();
        }
        let api = self.api;
        // SAFETY: ctx/name are live for this command; the strings belong
        // to `applied`.
        unsafe {
            (api.replicate)(
                self.ctx,
                c"HSET".as_ptr(),
                c"sssss".as_ptr(),
                self.name,
                api.tokens_field.0,
                applied.tokens.ptr(),
                api.last_refill_field.0,
                applied.last_refill.ptr(),
            );
            (api.replicate)(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.name,
                applied.deadline_ms as std::os::raw::c_longlong,
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
            // write-open (`set_module_options` in load.rs), so WATCH and
            // client tracking are told here, only when the bucket changed.
            (api.signal_modified_key)(self.ctx, self.name);
        }
    }

    /// Stores `state` with its absolute expiry and propagates it: `apply`
    /// then `propagate`, for a lone bucket.
    pub fn write(&self, state: &State, now_ms: i64, deadline_ms: i64) -> Result<(), TbError> {
        let applied = self
            .apply(state, now_ms, deadline_ms)
            .map_err(|WriteFailed| TbError::WriteFailed)?;
        self.propagate(&applied);
        Ok(())
    }

    fn create_string(&self, bytes: &[u8]) -> ServerString<'a> {
        ServerString::from_bytes(self.api, self.ctx, bytes)
    }

    /// RM_HashSet of both fields; false if the server refused.
    fn set_fields(&self, tokens: &ServerString, last_refill: &ServerString) -> bool {
        // RM_HashSet returns how many fields it updated, so 0 is also the
        // answer for a new bucket; only errno tells a refusal (EINVAL,
        // ENOTSUP, EBADF) from that (ENOENT).
        // SAFETY: the key is open for writing; field/value pairs and a NULL
        // terminator as RM_HashSet expects; errno is this thread's.
        unsafe {
            *libc::__errno_location() = 0;
            let updated = (self.api.hash_set)(
                self.key,
                REDISMODULE_HASH_NONE as c_int,
                self.api.tokens_field.0,
                tokens.ptr(),
                self.api.last_refill_field.0,
                last_refill.ptr(),
                ptr::null::<RedisModuleString>(),
            );
            let errno = *libc::__errno_location();
            let refused = updated == 0 && errno != 0 && errno != libc::ENOENT;
            !refused && (self.api.key_type)(self.key) as isize == REDISMODULE_KEYTYPE_HASH
        }
    }

    /// Sets the absolute expiry; false if the server refused.
    fn set_deadline(&self, now_ms: i64, deadline_ms: i64) -> bool {
        // SAFETY: the key is open for writing and holds the hash.
        let status = unsafe {
            match self.api.set_abs_expire {
                Some(set_abs_expire) => set_abs_expire(self.key, deadline_ms),
                None => (self.api.set_expire)(self.key, deadline_ms.saturating_sub(now_ms).max(1)),
            }
        };
        status == REDISMODULE_OK as c_int
    }

    /// Puts the fields back as they were read, or deletes the key if it was
    /// empty, after a write that must not stand.
    fn restore_fields(&self) {
        let restored = match &self.prior {
            // SAFETY: the key is open for writing.
            None => unsafe { (self.api.delete_key)(self.key) == REDISMODULE_OK as c_int },
            Some((tokens, last_refill)) => self.set_fields(tokens, last_refill),
        };
        if !restored {
            self.warn_not_restored();
        }
    }

    fn warn_not_restored(&self) {
        self.api.log(
            self.ctx,
            c"warning",
            "tb: could not undo a failed bucket write; the key may differ from its replicas",
        );
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

/// A stored field as a finite number, `None` if absent or not a number.
fn number(field: &ServerString) -> Option<f64> {
    parse_decimal(field.bytes(), Sign::Allowed)
}

/// Stores every outcome that writes, all or none.
///
/// Every write is first applied to the keyspace only; if the server
/// refuses one, those already applied are taken back, nothing is
/// propagated and the command fails, so no replica, AOF or watcher can see
/// what the master does not hold. Only then is each write propagated.
pub fn write_all(outcomes: &[(&BucketKey, &Outcome)], now_ms: i64) -> Result<(), TbError> {
    let deadline = |outcome: &Outcome| bucket::expire_at_ms(now_ms, outcome.reset_after_ms);
    // One bucket, the usual case: nothing to take back, so nothing to keep
    // (and no allocation on the hot path).
    if let [(bucket, outcome)] = outcomes {
        return match &outcome.write {
            Some(state) => bucket.write(state, now_ms, deadline(outcome)),
            None => Ok(()),
        };
    }
    let writes = outcomes
        .iter()
        .filter(|(_, outcome)| outcome.write.is_some())
        .count();
    // What to put back if a later write fails; a lone write needs none.
    let expiries: Vec<Expiry> = if writes > 1 {
        outcomes.iter().map(|(bucket, _)| bucket.expiry()).collect()
    } else {
        Vec::new()
    };
    let mut applied = Vec::with_capacity(writes);
    for (index, (bucket, outcome)) in outcomes.iter().enumerate() {
        let Some(state) = &outcome.write else {
            continue;
        };
        match bucket.apply(state, now_ms, deadline(outcome)) {
            Ok(done) => applied.push((index, done)),
            Err(WriteFailed) => {
                // Test-only (`fault-skip-rollback yes`, src/testing/fault.rs): shows
                // the rollback tests fail without the rollback, so they reach it.
                if fault::rollback_skipped() {
                    return Err(TbError::WriteFailed);
                }
                for (index, done) in applied.into_iter().rev() {
                    if let Some((bucket, _)) = outcomes.get(index) {
                        let expiry = expiries.get(index).copied().unwrap_or(Expiry::Unknown);
                        bucket.rollback(done, expiry);
                    }
                }
                return Err(TbError::WriteFailed);
            }
        }
    }
    for (index, done) in &applied {
        if let Some((bucket, _)) = outcomes.get(*index) {
            bucket.propagate(done);
        }
    }
    Ok(())
}

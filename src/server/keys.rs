//! Key access both data types share, as safe calls: opening a key with its
//! type checked ([`open`], through `Context::open`), read or write
//! ([`Access`]), and what an open [`Key`] offers: its type and length, hash
//! fields, sorted-set members and score ranges, a string's value, its
//! expiry, deleting it. Each is a thin, inlined wrapper of one module API
//! function; the key is closed when dropped.
//!
//! What the types hold to: a key cannot outlive its context, a score range
//! borrows its key exclusively (no write, no second range meanwhile), and a
//! string's bytes are read in place only by a plain function that cannot
//! reach the key. What they do not (as with the redis-module crate's keys):
//! two handles open on the same key at once, where a delete through one
//! leaves the other on a freed value. The module never does that: a handler
//! drops one key before it opens the same name again (throttle.rs's
//! conversion), and TB.TAKEALL refuses a key named twice before it opens any.

use std::os::raw::c_int;
use std::ptr::{self, NonNull};

use redis_module::raw::{
    self, RedisModuleKey, RedisModuleString, REDISMODULE_HASH_DELETE, REDISMODULE_HASH_NONE,
    REDISMODULE_KEYTYPE_EMPTY, REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_STRING,
    REDISMODULE_KEYTYPE_ZSET, REDISMODULE_NO_EXPIRE, REDISMODULE_OK, REDISMODULE_READ,
    REDISMODULE_WRITE,
};
use redis_tb_core::error::TbError;

use super::context::Context;
use super::strings::{ServerStr, ServerString};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The value types the module reads and writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    Hash,
    Zset,
    String,
}

impl KeyType {
    #[inline]
    fn code(self) -> isize {
        match self {
            KeyType::Hash => REDISMODULE_KEYTYPE_HASH,
            KeyType::Zset => REDISMODULE_KEYTYPE_ZSET,
            KeyType::String => REDISMODULE_KEYTYPE_STRING,
        }
    }
}

/// An open key, closed when dropped.
pub struct Key<'a> {
    context: Context<'a>,
    ptr: NonNull<RedisModuleKey>,
}

/// Opens `name` and checks that it is missing or of the type `wanted`, so
/// WRONGTYPE is answered before anything is touched; on that error the key
/// is closed again. `None` when a read-only open finds nothing: simply an
/// empty bucket or lease set (a write open always gives a key).
#[inline]
pub(super) fn open<'a>(
    context: Context<'a>,
    name: &ServerStr,
    access: Access,
    wanted: KeyType,
) -> Result<Option<Key<'a>>, TbError> {
    let mode = match access {
        Access::Read => REDISMODULE_READ,
        Access::Write => REDISMODULE_READ | REDISMODULE_WRITE,
    };
    // SAFETY: a live context and key name.
    let ptr = unsafe { (context.api().open_key)(context.ptr(), name.ptr(), mode as c_int) };
    let Some(ptr) = NonNull::new(ptr) else {
        return Ok(None);
    };
    let key = Key { context, ptr };
    match key.type_code() {
        kind if kind == REDISMODULE_KEYTYPE_EMPTY || kind == wanted.code() => Ok(Some(key)),
        _ => Err(TbError::WrongType), // `key` is closed as it drops
    }
}

/// A hash field's new value in [`Key::hash_set`].
#[derive(Clone, Copy)]
pub enum HashValue<'s> {
    Set(&'s ServerStr),
    Delete,
}

impl HashValue<'_> {
    #[inline]
    fn ptr(self) -> *mut RedisModuleString {
        match self {
            HashValue::Set(value) => value.ptr(),
            HashValue::Delete => REDISMODULE_HASH_DELETE.cast_mut(),
        }
    }
}

/// The expiry that means none (`REDISMODULE_NO_EXPIRE`), for
/// [`Key::set_abs_expire`].
pub const NO_EXPIRE: i64 = REDISMODULE_NO_EXPIRE as i64;

/// The server refused a write (`RM_HashSet`: EINVAL, ENOTSUP, EBADF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

/// The key holds no string (`Key::string_value`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotAString;

/// Where a score range's iteration starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RangeStart {
    Lowest,
    Highest,
}

impl<'a> Key<'a> {
    #[inline]
    fn api(&self) -> &'static super::api::Api {
        self.context.api()
    }

    #[inline]
    fn type_code(&self) -> isize {
        // SAFETY: an open key.
        unsafe { (self.api().key_type)(self.ptr.as_ptr()) as isize }
    }

    /// The key holds nothing (a write open of a missing key).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.type_code() == REDISMODULE_KEYTYPE_EMPTY
    }

    /// The key holds a value of type `kind`.
    #[inline]
    pub fn holds(&self, kind: KeyType) -> bool {
        self.type_code() == kind.code()
    }

    /// The value's length: a hash's fields, a sorted set's members
    /// (`RM_ValueLength`); 0 for an empty key.
    #[inline]
    pub fn length(&self) -> usize {
        // SAFETY: an open key, of any type.
        unsafe { (self.api().zset.length)(self.ptr.as_ptr()) }
    }

    /// Deletes the key's value; false if the server refused.
    #[inline]
    pub fn delete(&self) -> bool {
        // SAFETY: an open key (a write open, or the server refuses).
        unsafe { (self.api().delete_key)(self.ptr.as_ptr()) == REDISMODULE_OK as c_int }
    }

    /// The values of up to four hash `fields`, each `None` if missing (or
    /// the key is not a hash).
    #[inline]
    pub fn hash_get<const N: usize>(
        &self,
        fields: [&ServerStr; N],
    ) -> [Option<ServerString<'a>>; N] {
        const { assert!(N >= 1 && N <= 4, "hash_get reads one to four fields") };
        let mut values: [*mut RedisModuleString; N] = [ptr::null_mut(); N];
        let (get, key, none) = (
            self.api().hash_get,
            self.ptr.as_ptr(),
            REDISMODULE_HASH_NONE,
        );
        let end = ptr::null::<RedisModuleString>();
        // One call per count of fields, written once: RM_HashGet is variadic.
        macro_rules! get_fields {
            ($($field:ident $out:ident),+) => {
                get(key, none as c_int, $($field.ptr(), $out as *mut _,)+ end)
            };
        }
        // SAFETY (each arm): an open key; field names, each followed by an
        // out-pointer, and a NULL terminator. Missing fields come back NULL.
        unsafe {
            match (fields.as_slice(), values.as_mut_slice()) {
                ([a], [x]) => get_fields!(a x),
                ([a, b], [x, y]) => get_fields!(a x, b y),
                ([a, b, c], [x, y, z]) => get_fields!(a x, b y, c z),
                ([a, b, c, d], [x, y, z, w]) => get_fields!(a x, b y, c z, d w),
                _ => 0,
            };
        }
        // SAFETY: each value RM_HashGet made is the module's to free.
        values.map(|value| unsafe { ServerString::owned(self.context, value) })
    }

    /// Sets (or deletes) up to six hash fields, creating the hash if the
    /// key is empty: how many fields were updated (`RM_HashSet`), or
    /// `Refused`.
    #[inline]
    pub fn hash_set<const N: usize>(
        &self,
        fields: [(&ServerStr, HashValue); N],
    ) -> Result<usize, Refused> {
        const { assert!(N >= 1 && N <= 6, "hash_set writes one to six fields") };
        let (set, key, none) = (
            self.api().hash_set,
            self.ptr.as_ptr(),
            REDISMODULE_HASH_NONE,
        );
        let end = ptr::null::<RedisModuleString>();
        // One call per count of fields, written once: RM_HashSet is variadic.
        macro_rules! set_fields {
            ($($field:ident),+) => {
                set(key, none as c_int, $($field.0.ptr(), $field.1.ptr(),)+ end)
            };
        }
        // RM_HashSet returns how many fields it updated, so 0 is also the
        // answer for a new hash; only errno tells a refusal (EINVAL, ENOTSUP,
        // EBADF) from that (ENOENT).
        // SAFETY: an open key; field/value pairs and a NULL terminator, as
        // RM_HashSet expects; errno is this thread's.
        unsafe {
            *libc::__errno_location() = 0;
            let updated = match fields.as_slice() {
                [a] => set_fields!(a),
                [a, b] => set_fields!(a, b),
                [a, b, c] => set_fields!(a, b, c),
                [a, b, c, d] => set_fields!(a, b, c, d),
                [a, b, c, d, e] => set_fields!(a, b, c, d, e),
                [a, b, c, d, e, g] => set_fields!(a, b, c, d, e, g),
                _ => 0,
            };
            let errno = *libc::__errno_location();
            if updated == 0 && errno != 0 && errno != libc::ENOENT {
                return Err(Refused);
            }
            Ok(usize::try_from(updated).unwrap_or(0))
        }
    }

    /// Sets the absolute expiry (Unix ms; `NO_EXPIRE` removes it): whether
    /// the server took it, or `None` where it lacks `RM_SetAbsExpire`
    /// (Redis 7.0.0-7.0.4).
    #[inline]
    pub fn set_abs_expire(&self, at_ms: i64) -> Option<bool> {
        let set_abs_expire = self.api().set_abs_expire?;
        // SAFETY: an open key.
        Some(unsafe { set_abs_expire(self.ptr.as_ptr(), at_ms) } == REDISMODULE_OK as c_int)
    }

    /// Sets the expiry `ttl_ms` from now; whether the server took it.
    #[inline]
    pub fn set_expire(&self, ttl_ms: i64) -> bool {
        // SAFETY: an open key.
        unsafe { (self.api().set_expire)(self.ptr.as_ptr(), ttl_ms) == REDISMODULE_OK as c_int }
    }

    /// The absolute expiry in Unix ms (negative: none), or `None` where the
    /// server lacks `RM_GetAbsExpire`.
    #[inline]
    pub fn abs_expire(&self) -> Option<i64> {
        let get_abs_expire = self.api().get_abs_expire?;
        // SAFETY: an open key.
        Some(unsafe { get_abs_expire(self.ptr.as_ptr()) })
    }

    /// The time to live in ms (negative: none).
    #[inline]
    pub fn ttl(&self) -> i64 {
        // SAFETY: an open key.
        unsafe { (self.api().get_expire)(self.ptr.as_ptr()) }
    }

    /// Adds `member` with `score` (or moves it), creating the sorted set if
    /// the key is empty; false if the server refused.
    #[inline]
    pub fn zset_add(&self, score: f64, member: &ServerStr) -> bool {
        let mut flags: c_int = 0;
        // SAFETY: an open key; the server checks its type.
        let status =
            unsafe { (self.api().zset.add)(self.ptr.as_ptr(), score, member.ptr(), &mut flags) };
        status == REDISMODULE_OK as c_int
    }

    /// Removes `member`: whether it was there, or `Refused`.
    #[inline]
    pub fn zset_rem(&self, member: &ServerStr) -> Result<bool, Refused> {
        let mut deleted: c_int = 0;
        // SAFETY: an open key; the server checks its type.
        let status =
            unsafe { (self.api().zset.rem)(self.ptr.as_ptr(), member.ptr(), &mut deleted) };
        if status != REDISMODULE_OK as c_int {
            return Err(Refused);
        }
        Ok(deleted != 0)
    }

    /// The score of `member`, if it is in the set.
    #[inline]
    pub fn zset_score(&self, member: &ServerStr) -> Option<f64> {
        let mut score = 0.0;
        // SAFETY: an open key; the server checks its type.
        let found = unsafe { (self.api().zset.score)(self.ptr.as_ptr(), member.ptr(), &mut score) }
            == REDISMODULE_OK as c_int;
        found.then_some(score)
    }

    /// Iterates the members scored in `[min, max]` (either bound
    /// exclusive), from the lowest or the highest; `None` if the key is no
    /// sorted set or the range is invalid. The key is borrowed for it: one
    /// iteration at a time, and no write meanwhile.
    #[inline]
    pub fn score_range(
        &mut self,
        from: RangeStart,
        (min, min_excluded): (f64, bool),
        (max, max_excluded): (f64, bool),
    ) -> Option<ScoreRange<'_, 'a>> {
        let zset = &self.api().zset;
        let start = match from {
            RangeStart::Lowest => zset.first_in_score_range,
            RangeStart::Highest => zset.last_in_score_range,
        };
        // SAFETY: an open key; the server checks its type and the range.
        let status = unsafe {
            start(
                self.ptr.as_ptr(),
                min,
                max,
                c_int::from(min_excluded),
                c_int::from(max_excluded),
            )
        };
        (status == REDISMODULE_OK as c_int).then_some(ScoreRange { key: self })
    }

    /// Reads a string value in place (`RM_StringDMA`, no copy): `read`'s
    /// result, or `None` if the key holds no string. `read` is a plain
    /// function, so it cannot write the key while it reads the bytes.
    pub fn read_string<R>(&self, read: fn(&[u8]) -> R) -> Option<R> {
        // SAFETY: an open key; a read-mode DMA only reads, and the slice
        // does not outlive `read`, which cannot reach the key.
        unsafe {
            let dma = raw::RedisModule_StringDMA?;
            let mut len = 0usize;
            let ptr = dma(self.ptr.as_ptr(), &mut len, REDISMODULE_READ as c_int);
            if ptr.is_null() {
                return None;
            }
            Some(read(std::slice::from_raw_parts(ptr.cast::<u8>(), len)))
        }
    }

    /// A copy of the string value: `NotAString` if the key holds another
    /// type, `None` if the copy could not be made.
    pub fn string_value(&self) -> Result<Option<ServerString<'a>>, NotAString> {
        let context = self.context;
        // SAFETY: as in `read_string`; the bytes are copied before it ends.
        unsafe {
            let dma = raw::RedisModule_StringDMA.ok_or(NotAString)?;
            let mut len = 0usize;
            let ptr = dma(self.ptr.as_ptr(), &mut len, REDISMODULE_READ as c_int);
            if ptr.is_null() {
                return Err(NotAString);
            }
            Ok(context.string(std::slice::from_raw_parts(ptr.cast::<u8>(), len)))
        }
    }

    /// Stores `value` as the key's string; false if the server refused.
    pub fn string_set(&self, value: &ServerStr) -> bool {
        // SAFETY: an open key (written: the server checks the mode).
        unsafe {
            match raw::RedisModule_StringSet {
                Some(string_set) => {
                    string_set(self.ptr.as_ptr(), value.ptr()) == REDISMODULE_OK as c_int
                }
                None => false,
            }
        }
    }
}

impl Drop for Key<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: opened by `open`, closed exactly once.
        unsafe { (self.api().close_key)(self.ptr.as_ptr()) };
    }
}

/// A score range being iterated ([`Key::score_range`]); stopped when
/// dropped.
pub struct ScoreRange<'k, 'a> {
    key: &'k mut Key<'a>,
}

impl<'a> ScoreRange<'_, 'a> {
    /// The iteration has passed the range's last member.
    #[inline]
    pub fn at_end(&self) -> bool {
        // SAFETY: an open key with a range started.
        unsafe { (self.key.api().zset.range_end_reached)(self.key.ptr.as_ptr()) != 0 }
    }

    /// The current member (a new string; `None` past the end) and its
    /// score.
    #[inline]
    pub fn current(&self) -> (Option<ServerString<'a>>, f64) {
        let mut score = 0.0;
        // SAFETY: an open key with a range started; the element is a new
        // string, the module's to free.
        unsafe {
            let element =
                (self.key.api().zset.range_current_element)(self.key.ptr.as_ptr(), &mut score);
            (ServerString::owned(self.key.context, element), score)
        }
    }

    /// Moves to the next member; false if there is none.
    #[inline]
    pub fn advance(&mut self) -> bool {
        // SAFETY: an open key with a range started.
        unsafe { (self.key.api().zset.range_next)(self.key.ptr.as_ptr()) != 0 }
    }
}

impl Drop for ScoreRange<'_, '_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: an open key with a range started, stopped once.
        unsafe { (self.key.api().zset.range_stop)(self.key.ptr.as_ptr()) };
    }
}

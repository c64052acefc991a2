//! Server strings as the handlers see them: [`ServerStr`], one the server
//! lends (a command's argument, a field name made at load), read as its
//! bytes; and [`ServerString`], one this module owns and frees. Like `str`
//! and `String`: an owned string derefs to a borrowed one, and both deref
//! to bytes, so a handler passes either where a key name or a value is
//! wanted and reads either as `&[u8]`.

use std::ops::Deref;
use std::ptr::NonNull;

use redis_module::raw::RedisModuleString;

use super::api;
use super::context::Context;

/// A server string this module may read but does not own: it lives as long
/// as the borrow of it. Never null. Deref reads its bytes
/// (`RM_StringPtrLen`, a few instructions and no copy).
#[repr(transparent)]
pub struct ServerStr(*mut RedisModuleString);

impl ServerStr {
    /// The command's arguments as they came, without a copy.
    ///
    /// # Safety
    /// Every pointer must be a live, non-null server string for as long as
    /// the slice is borrowed.
    #[inline]
    pub(super) unsafe fn slice(strings: &[*mut RedisModuleString]) -> &[ServerStr] {
        // SAFETY: `ServerStr` is `repr(transparent)` over the pointer, so the
        // two slices have the same layout; the caller vouches for the strings.
        unsafe { &*(strings as *const [*mut RedisModuleString] as *const [ServerStr]) }
    }

    /// A string the server keeps alive as long as `pointer` is borrowed.
    ///
    /// # Safety
    /// `*pointer` must be a live, non-null server string while borrowed.
    #[inline]
    pub(super) unsafe fn at(pointer: &*mut RedisModuleString) -> &ServerStr {
        // SAFETY: as in `slice`, for one pointer.
        unsafe { &*(pointer as *const *mut RedisModuleString).cast::<ServerStr>() }
    }

    /// The pointer, for the server functions in server/.
    #[inline]
    pub(super) fn ptr(&self) -> *mut RedisModuleString {
        self.0
    }

    /// The string's bytes, borrowed with it.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        let Some(api) = api::api() else {
            return &[];
        };
        let mut len = 0usize;
        // SAFETY: a live, non-null string (the type's promise); the bytes
        // stay valid while it is borrowed, as the returned slice is.
        unsafe {
            let ptr = (api.string_ptr_len)(self.0, &mut len);
            if ptr.is_null() {
                return &[];
            }
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        }
    }
}

impl Deref for ServerStr {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

/// A server string this module created, or was handed by the server to
/// free (a hash field's value, a sorted set's member); freed when dropped.
/// Never null: the functions that make one return `None` instead.
pub struct ServerString<'a> {
    context: Context<'a>,
    ptr: NonNull<RedisModuleString>,
}

impl<'a> ServerString<'a> {
    /// Takes ownership of a string the server handed over, `None` for null.
    ///
    /// # Safety
    /// `ptr` must be null or a string this module now owns, made on (or
    /// good for) `context`.
    #[inline]
    pub(super) unsafe fn owned(context: Context<'a>, ptr: *mut RedisModuleString) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| ServerString { context, ptr })
    }
}

impl Deref for ServerString<'_> {
    type Target = ServerStr;

    #[inline]
    fn deref(&self) -> &ServerStr {
        // SAFETY: `NonNull` is `repr(transparent)` over the pointer, and the
        // string lives as long as `self`, which the borrow cannot outlive.
        unsafe { &*(&self.ptr as *const NonNull<RedisModuleString>).cast::<ServerStr>() }
    }
}

impl Drop for ServerString<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: created for or handed to this module, freed once.
        unsafe { (self.context.api().free_string)(self.context.ptr(), self.ptr.as_ptr()) };
    }
}

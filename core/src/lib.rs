//! redis-tb's pure core: everything the module decides, with no server in
//! sight. Numbers and their text ([`number`]), arguments ([`args`]), every
//! error ([`error`]), the token bucket ([`bucket`]), the lease rules
//! ([`lease`]) and the waiting machine with its two kinds ([`wait`]); and
//! one rule only the client libraries run, the denial cache's priming
//! window ([`denial_cache`]), so that its spec is written here too.
//!
//! It may import only the standard library and `ryu`; never `redis_module`
//! (it is not a dependency, so the compiler keeps this promise). Time comes
//! in as an argument, state as values. Where each thing lives:
//! docs/development.md, "Where to change what".

#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

pub mod args;
pub mod bucket;
pub mod denial_cache;
pub mod error;
pub mod lease;
pub mod lockout;
pub mod number;
pub mod throttle;
pub mod top;
pub mod wait;

#[cfg(test)]
use test_alloc::live_bytes;

// The waiting machine's tests measure what a structure keeps with a
// counting allocator (`live_bytes`), per thread so parallel tests do not
// see each other's allocations.
#[cfg(test)]
mod test_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
    }

    /// Bytes this thread has allocated and not freed.
    pub fn live_bytes() -> isize {
        LIVE.with(Cell::get)
    }

    fn count(delta: isize) {
        // `try_with`: nothing to count while the thread is being torn down.
        let _ = LIVE.try_with(|live| live.set(live.get() + delta));
    }

    pub struct Counting;

    // SAFETY: every call is forwarded to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size() as isize);
            System.alloc(layout)
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(-(layout.size() as isize));
            System.dealloc(ptr, layout)
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size as isize - layout.size() as isize);
            System.realloc(ptr, layout, new_size)
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;
}

//! redis-tb: a token-bucket rate limiter inside Redis and Valkey.
//!
//! `TB.TAKE key capacity rate n` refills, caps and takes in one step. Redis
//! runs a module command to completion on its single command thread, so no
//! other client can read or write the bucket between the read and the write:
//! the same atomicity a Lua script gets, without a script cache, a NOSCRIPT
//! fallback or a clock supplied by the client.
//!
//! Layout:
//! - `bucket.rs`: the arithmetic, pure (no Redis types, no clock);
//! - `args.rs`, `number.rs`: input parsing; `error.rs`: every error reply;
//! - `commands.rs`: the command handlers, their reply, shadow mode;
//! - `wait.rs`: waiting in the server (TB.BTAKE, TB.ACQUIRE), a pure state
//!   machine generic over what is waited for; `wait_glue.rs`: the glue that
//!   blocks clients and feeds each kind's machine the server's callbacks;
//!   `kinds.rs`: the two kinds of wait, tokens and leases, pure;
//!   `btake.rs`: TB.BTAKE and its tokens kind's server side;
//! - `store.rs`: reading and writing a bucket's hash, propagation, and
//!   all-or-nothing writes of several buckets;
//! - `lease.rs`: the rules of concurrency leases, pure; `lease_set.rs`:
//!   their sorted set in the keyspace; `lease_commands.rs`: TB.ACQUIRE,
//!   TB.RELEASE and TB.RENEW, and the leases kind's server side;
//! - `command_info.rs`: command registration and COMMAND DOCS;
//! - `api.rs`: the server functions, resolved once; `metrics.rs`: INFO tb;
//! - `load.rs`: loading (OnLoad, load arguments, configs, module options,
//!   the command table, server events); `fault.rs`: test-only fault
//!   injection for failed writes.

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

mod api;
mod args;
mod btake;
pub mod bucket;
mod command_info;
mod commands;
mod error;
mod fault;
#[cfg(feature = "bench-floor")]
mod floor;
mod kinds;
pub mod lease;
mod lease_commands;
mod lease_set;
mod load;
mod metrics;
pub mod number;
mod store;
mod wait;
mod wait_glue;

// Unit tests run outside a server, where the server's allocator does not
// exist; they use the system allocator instead, counted per thread so a
// test can measure what a structure keeps (`test_alloc::live_bytes`).
#[cfg(not(test))]
type ModuleAlloc = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type ModuleAlloc = test_alloc::Counting;

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
}

#[cfg(test)]
pub use test_alloc::live_bytes;

/// Every heap allocation of the module goes through the server's allocator,
/// so `INFO memory` and `MEMORY` commands account for it.
#[global_allocator]
static ALLOCATOR: ModuleAlloc = ModuleAlloc {};

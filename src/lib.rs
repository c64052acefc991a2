//! redis-tb: a token-bucket rate limiter inside Redis and Valkey.
//!
//! `TB.TAKE key capacity rate n` refills, caps and takes in one step. Redis
//! runs a module command to completion on its single command thread, so no
//! other client can read or write the bucket between the read and the write:
//! the same atomicity a Lua script gets, without a script cache, a NOSCRIPT
//! fallback or a clock supplied by the client.
//!
//! This crate is the glue around the pure core (`redis_tb_core`, in core/):
//! `server/` is the frame every command runs in, `bucket/` and `lease/` the
//! two data types, `testing/` what only tests and benches build. Where each
//! thing lives: docs/development.md, "Where to change what".

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

mod bucket;
mod lease;
mod server;
mod testing;

/// Every heap allocation of the module goes through the server's allocator,
/// so `INFO memory` and `MEMORY` commands account for it. Unit tests run
/// outside a server, where that allocator does not exist, and keep the
/// system's.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: redis_module::alloc::RedisAlloc = redis_module::alloc::RedisAlloc {};

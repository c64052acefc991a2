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
//! - `args.rs`, `number.rs`: input parsing;
//! - `commands.rs`: the command handlers, their reply, shadow mode;
//! - `btake.rs` (glue) and `wait.rs` (pure bookkeeping): TB.BTAKE's queues;
//! - `store.rs`: reading and writing a bucket's hash, propagation;
//! - `command_info.rs`: command registration and COMMAND DOCS;
//! - `api.rs`: the server functions, resolved once; `metrics.rs`: INFO tb;
//! - this file: loading (OnLoad, load arguments, configs, module options).

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
mod load;
mod metrics;
pub mod number;
mod store;
mod wait;

// Unit tests run outside a server, where the server's allocator does not
// exist; they use the system allocator instead.
#[cfg(not(test))]
type ModuleAlloc = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type ModuleAlloc = std::alloc::System;

/// Every heap allocation of the module goes through the server's allocator,
/// so `INFO memory` and `MEMORY` commands account for it.
#[global_allocator]
static ALLOCATOR: ModuleAlloc = ModuleAlloc {};

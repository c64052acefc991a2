//! The frame every command runs in: the server API table, loading, every
//! setting, key access, the reply frame, the command table with COMMAND
//! DOCS, INFO tb, TB.TOP's summary of the keys denied most (fed by both
//! data types' denials), and blocking clients for the waits of both.
//!
//! Every `unsafe` of the module is here. A handler gets a [`context::Context`]
//! and its arguments as [`strings::ServerStr`]s (read as bytes), and does
//! all it needs through them: open a key (`keys.rs`), read and write its
//! hash fields, sorted-set members or string, set its expiry, replicate,
//! notify, reply, block, read the clock. Those wrappers are generic (keys,
//! hashes, sorted sets, strings), never about a bucket or a lease.
//!
//! May import: the core crate and redis-module. Only two files name
//! anything of bucket/, lease/ or testing/: `command_table.rs` may also
//! import: bucket/ and lease/ (the handlers it registers); `load.rs` may
//! also import: bucket/ and testing/ (the bench-only commands, the
//! fault-injection build's load arguments). (tests/layers.rs reads these
//! rules.)

pub mod api;
pub mod blocking;
pub mod command_table;
pub mod config;
pub mod context;
pub mod keys;
pub mod load;
pub mod machines;
pub mod metrics;
pub mod reply;
pub mod strings;
pub mod top;

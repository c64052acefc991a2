//! The frame every command runs in: the server API table, loading, every
//! setting, key access, the reply frame, the command table with COMMAND
//! DOCS, INFO tb, and blocking clients for the waits of both data types.
//!
//! May import the core crate and redis-module. Only `command_table.rs`
//! (the handlers it registers) and `load.rs` (the bench-only commands)
//! name anything of bucket/, lease/ or testing/.

pub mod api;
pub mod blocking;
pub mod command_table;
pub mod config;
pub mod keys;
pub mod load;
pub mod machines;
pub mod metrics;
pub mod reply;

//! Shared integration-test harness: real servers with the built module loaded, and the
//! helpers the test files share, one part per job:
//!
//! - [`server`]: starting, stopping and restarting a server, connecting, cleaning up;
//! - [`commands`]: calling the TB.* commands and reading the keys they write;
//! - [`raw_client`]: a bare RESP client for blocking commands (a waiter with no reply yet);
//! - [`replication`]: replicas, replication offsets, a server turned replica under a waiter;
//! - [`aof`]: the commands in the append-only file;
//! - [`cell`]: redis-cell's module (`CL.THROTTLE`), built outside the tree, to load beside;
//! - [`clock`]: a server whose clock the test moves, forwards and back (libfaketime);
//! - [`twin`]: the Lua twin (`lua/tb.lua`) and the differential harness against the module;
//! - [`backend`]: a behaviour case written once, run on the module and on the twin
//!   ([`on_every_backend!`]);
//! - [`buckets`]: frozen buckets and locks written by hand, and the lock a call stored;
//! - [`vectors`]: the core's vector files (clients/conformance/vectors/), read for the replays;
//! - [`rng`]: a small seeded generator for test inputs.
//!
//! Nothing here is mocked: replies, errors and timings come from the server itself.
//!
//! Environment:
//! - `TB_MODULE`: path of the module to load (default `target/release/libredis_tb.so`).
//! - `TB_FAULT_MODULE`: the fault-injection build (default `target/fault/debug/libredis_tb.so`).
//! - `TB_SERVER`: server binary (default `redis-server` from `PATH`).
//! - `TB_CELL_MODULE`: redis-cell's .so (default: built by `scripts/build-redis-cell.sh`).
//! - `TB_START_TIMEOUT_MS`: how long a starting server may take to answer PING (default
//!   10000); raised by `scripts/sanitize.sh`, whose server runs under valgrind.

pub mod aof;
pub mod backend;
pub mod buckets;
pub mod cell;
pub mod clock;
pub mod commands;
pub mod raw_client;
pub mod replication;
pub mod rng;
mod self_check;
pub mod server;
pub mod twin;
pub mod vectors;

// Every test file takes what it needs from one flat namespace (`use crate::harness::*`).
pub use self::{
    aof::*, backend::*, buckets::*, cell::*, clock::*, commands::*, raw_client::*, replication::*,
    rng::*, server::*, twin::*, vectors::*,
};

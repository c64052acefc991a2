//! The module's integration tests, as one program: real servers on loopback ports with the
//! built module loaded, talked to over TCP. One folder per axis:
//!
//! - [`harness`]: starting servers, clients, replicas, the AOF, the Lua twin (and its own checks);
//! - [`commands`]: each command's replies, errors and stored state, one server at a time; the
//!   behaviour cases of the options and the new commands run on the module and on the twin
//!   (`<case>::on_module`, `<case>::on_twin`);
//! - [`waiting`]: TB.BTAKE's queue, under the server's own events and a soak;
//! - [`leases`]: TB.ACQUIRE, TB.RELEASE and TB.RENEW;
//! - [`twin`]: the Lua twin (`lua/tb.lua`) against the module, and its script form;
//! - [`topology`]: replicas, persistence, failover and cluster;
//! - [`server`]: what the server does around the module (lifecycle, notifications, OOM,
//!   refused writes, transactions, INFO, configs and ACL);
//! - [`compat`]: redis-cell's CL.THROTTLE;
//! - [`release`]: the artifacts `make dist` writes, installed as a user would.
//!
//! `cargo test --test it <path>` runs one part, e.g. `cargo test --test it waiting::`.

mod harness;

mod commands;
mod compat;
mod leases;
mod release;
mod server;
mod topology;
mod twin;
mod waiting;

//! The token bucket in the keyspace: its hash (read, write, propagate), the
//! handlers of TB.TAKE, TB.PEEK, TB.REFUND, TB.TAKEALL, TB.CHARGE and
//! TB.UNBLOCK, TB.BTAKE, and TB.THROTTLE (redis-cell's contract).
//!
//! May import the core crate, redis-module, server/ and testing/'s fault
//! injection; never lease/.

pub mod btake;
pub mod commands;
pub mod hash;
pub mod throttle;

//! The token bucket in the keyspace: its hash (read, write, propagate), the
//! handlers of TB.TAKE, TB.PEEK, TB.REFUND and TB.TAKEALL, and TB.BTAKE.
//!
//! May import the core crate, redis-module, server/ and testing/'s fault
//! injection; never lease/.

pub mod btake;
pub mod commands;
pub mod hash;

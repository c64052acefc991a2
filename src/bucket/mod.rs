//! The token bucket in the keyspace: its hash (read, write, propagate), the
//! handlers of TB.TAKE, TB.PEEK, TB.REFUND, TB.TAKEALL, TB.CHARGE and
//! TB.UNBLOCK, TB.BTAKE, and TB.THROTTLE (redis-cell's contract); in the
//! bench-only build, TB.TAKE's floor (floor.rs).
//!
//! May import: the core crate, redis-module, server/ and testing/fault.rs
//! (fault injection); never lease/. (tests/layers.rs reads this rule.)

pub mod btake;
pub mod commands;
#[cfg(feature = "bench-floor")]
pub mod floor;
pub mod hash;
pub mod throttle;

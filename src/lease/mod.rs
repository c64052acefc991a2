//! Concurrency leases in the keyspace: the lease sorted set (read, write,
//! propagate) and the handlers of TB.ACQUIRE, TB.RELEASE and TB.RENEW.
//!
//! May import: the core crate, redis-module and server/; never bucket/.
//! (tests/layers.rs reads this rule.)

pub mod commands;
pub mod set;

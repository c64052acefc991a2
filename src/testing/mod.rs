//! What only tests and benchmarks build: fault injection (feature
//! `fault-injection`; without it every check compiles to `false`) and the
//! bench-only floor commands (feature `bench-floor`).
//!
//! May import: the core crate, redis-module, server/ and lease/.
//! (tests/layers.rs reads this rule.)

#[cfg(feature = "bench-floor")]
pub mod bench_floor;
pub mod fault;

//! Client library for [redis-tb](https://github.com/), the token-bucket rate
//! limiter for Redis and Valkey: the same API whether the module is loaded
//! (TB.TAKE ...) or not (the Lua fallback `lua/tb.lua`, as a FUNCTION library
//! or an EVALSHA script), draft-11 `RateLimit` headers, and (feature
//! `tower`) a tower/axum middleware; errors follow the one failure rule of
//! docs/clients.md. Concurrency limits (docs/leases.md): `acquire`,
//! `release`, `renew`, `wait_acquire`, drop guards ([`LeaseGuard`], and
//! `AsyncLeaseGuard` with renewal), and `ConcurrencyLimitLayer`. The keys
//! denied most: `top` (TB.TOP, merged over a cluster's masters). Metrics
//! through OpenTelemetry's API (feature `metrics`, docs/clients.md#metrics).
//! See README.md.
//!
//! ```no_run
//! # fn main() -> Result<(), redis_tb_client::Error> {
//! use redis_tb_client::RateLimiter;
//! let mut limiter = RateLimiter::open("redis://127.0.0.1/")?;
//! // 20 requests of burst, refilled at 5 per second; this request costs 1.
//! let d = limiter.take("user:42", 20, 5, 1)?;
//! for (name, value) in d.headers() {
//!     println!("{name}: {value}");
//! }
//! if !d.allowed { /* 429 */ }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

#[cfg(feature = "tokio")]
mod aio;
mod backend;
mod decision;
mod engine;
mod error;
mod lease;
mod limiter;
mod local;
mod metrics;
#[cfg(feature = "tower")]
mod middleware;
mod sync;
#[cfg(test)]
mod vectors;

#[cfg(feature = "tokio")]
pub use aio::{AsyncLeaseGuard, AsyncRateLimiter, LazyConnectionManager};
pub use backend::{lua_script, Backend, Logger, Timeouts, LUA_LIBRARY};
pub use decision::{
    bucket_key, check_policy, escape_id, key_slot, BucketKey, Decision, Limit, Policy, Source,
    TakeOptions, TopKey,
};
pub use error::{classify_reply, Error, FailureClass, Result};
pub use lease::{LeaseDecision, LeaseId, Permit, LEASE_POLL_DEFAULT};
pub use local::{OnUnavailable, LOCAL_MAX_KEYS_DEFAULT, LOCAL_PROBE_MS_DEFAULT};
#[cfg(feature = "tower")]
pub use middleware::{
    client_ip, connect_info_ip, default_id, lease_problem_body, problem_body,
    ConcurrencyLimitLayer, ConcurrencyLimitService, CostFn, ErrorHandler, KeyFn,
    LayerOnUnavailable, LeaseBody, RateLimitLayer, RateLimitService, INFLIGHT, LEASE_MS_DEFAULT,
    QUOTA_EXCEEDED,
};
pub use sync::{LeaseGuard, ManagedConnection, RateLimiter};

/// The `redis` crate this one is built on, for connections of the matching version.
pub use redis;

/// The `opentelemetry` crate this one records through (feature `metrics`),
/// for a meter provider of the matching version.
#[cfg(feature = "metrics")]
pub use opentelemetry;

/// This crate's version (the module's: both are 0.1.0).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

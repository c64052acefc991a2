//! The micro-benchmark of `make bench` (issue 26): what an answer without a
//! round trip costs next to one GET round trip, through this library's own
//! connection (`ManagedConnection`, the sync client).
//!
//! ```sh
//! cargo run --release --quiet --example local_bench -- --port P
//! ```
//!
//! `P` is a running server WITH the module on 127.0.0.1. Prints ONE line of
//! JSON on stdout, microseconds per call:
//! `{"library": "rust", "get_round_trip_us": x, "local_take_us": y, "cached_denial_us": z}`.

use redis_tb_client::{redis, ManagedConnection, OnUnavailable, RateLimiter, Source, Timeouts};
use std::net::TcpListener;
use std::time::Instant;

/// Calls per timed batch, and batches per measure (the median is taken).
const BATCH: u32 = 1_000;
const BATCHES: usize = 31;

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

/// The median over `BATCHES` batches of `BATCH / per_batch` runs of `f`
/// (each making `per_batch` calls), in µs per call.
fn median_us(per_batch: u32, mut f: impl FnMut() -> Fallible<()>) -> Fallible<f64> {
    let runs = (BATCH / per_batch).max(1);
    let mut samples = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let started = Instant::now();
        for _ in 0..runs {
            f()?;
        }
        let calls = f64::from(runs * per_batch);
        samples.push(started.elapsed().as_secs_f64() * 1e6 / calls);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[BATCHES / 2])
}

fn port_arg() -> Fallible<u16> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--port" {
            return Ok(args.next().ok_or("--port needs a value")?.parse()?);
        }
    }
    Err("usage: local_bench --port P".into())
}

/// A port nothing listens on: connections to it are refused at once.
fn closed_port() -> Fallible<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn main() -> Fallible<()> {
    let port = port_arg()?;
    let url = format!("redis://127.0.0.1:{port}/");
    let client = redis::Client::open(url.as_str())?;

    // (a) One GET round trip, timed one by one (each is long enough).
    let mut con = ManagedConnection::new(client.clone(), Timeouts::default());
    let _: () = redis::cmd("SET")
        .arg("bench:get")
        .arg("x")
        .query(&mut con)?;
    let get_us = median_us(10, || {
        for _ in 0..10 {
            let _: Option<String> = redis::cmd("GET").arg("bench:get").query(&mut con)?;
        }
        Ok(())
    })?;

    // (b) A take answered by the local limiter: Redis unreachable (a closed
    // port), in outage, no probe during the run.
    let down = redis::Client::open(format!("redis://127.0.0.1:{}/", closed_port()?))?;
    let mut local = RateLimiter::from_client(down, Timeouts::default())
        .with_logger(std::sync::Arc::new(|_, _| {}))
        .on_unavailable(OnUnavailable::Local)
        .local_probe_ms(3_600_000);
    let first = local.take("bench:local", 1e9, 1e6, 1)?;
    assert_eq!(
        first.source(),
        Source::Local,
        "the limiter is not in outage"
    );
    let local_us = median_us(1, || {
        local.take("bench:local", 1e9, 1e6, 1)?;
        Ok(())
    })?;

    // (c) A denied take answered from the denial cache: the bucket emptied
    // (one token, refilled in 1000 s), then the same take again and again.
    let _: () = redis::cmd("DEL").arg("bench:denied").query(&mut con)?;
    let mut cached = RateLimiter::from_client(client, Timeouts::default()).cache_denials(true);
    // The take that empties it leaves no token, so the cache already holds the next denial
    // (docs/clients.md#the-denial-cache: an allowed take that left fewer than n).
    let emptied = cached.take("bench:denied", 1, 0.001, 1)?;
    assert!(emptied.allowed && emptied.source() == Source::Server);
    let denied = cached.take("bench:denied", 1, 0.001, 1)?;
    assert!(!denied.allowed && denied.source() == Source::Cache);
    let cached_us = median_us(1, || {
        let d = cached.take("bench:denied", 1, 0.001, 1)?;
        debug_assert_eq!(d.source(), Source::Cache);
        Ok(())
    })?;

    println!(
        "{{\"library\": \"rust\", \"get_round_trip_us\": {get_us:.3}, \"local_take_us\": {local_us:.3}, \"cached_denial_us\": {cached_us:.3}}}"
    );
    Ok(())
}

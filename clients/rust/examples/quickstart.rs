//! The README's quick start, with the library's warnings shown the usual
//! way: `env_logger` prints what the `log` facade receives (run with
//! `RUST_LOG=redis_tb_client=info` to see the backend choice too).
//!
//! ```sh
//! cargo run --example quickstart -- redis://127.0.0.1/
//! ```

use redis_tb_client::RateLimiter;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Warnings and errors by default: the Lua fallback, the module gone, an
    // outage, a limiter bug. RUST_LOG overrides it.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();

    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1/".into());
    let mut limiter = RateLimiter::open(url.as_str())?;
    // Burst of 20, refilled at 5 per second; this request costs 1.
    let d = limiter.take("user:42", 20, 5, 1)?;
    println!("backend: {:?}", limiter.backend());
    for (name, value) in d.headers() {
        println!("{name}: {value}");
    }
    if !d.allowed {
        println!("429");
    }
    Ok(())
}

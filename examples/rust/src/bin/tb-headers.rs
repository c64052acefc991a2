//! A tiny command-line stand-in for an HTTP handler: takes one token and
//! prints the status code and headers a web server would send.
//!
//!     tb-headers REDIS_URL KEY CAPACITY RATE [N]
//!
//! If Redis cannot be reached (or answers an error) it fails open: a warning
//! on stderr, and `200` with no rate-limit headers.

use redis_tb_client_example::take;
use std::process::ExitCode;
use std::time::Duration;

/// Kept short so that an unreachable Redis costs little on every request.
const TIMEOUT: Duration = Duration::from_millis(250);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [url, key, capacity, rate, rest @ ..] if rest.len() <= 1 => (|| {
            let n = rest.first().map_or(Ok(1.0), |n| n.parse())?;
            Ok::<_, std::num::ParseFloatError>((url, key, capacity.parse()?, rate.parse()?, n))
        })(),
        _ => {
            eprintln!("usage: tb-headers REDIS_URL KEY CAPACITY RATE [N]");
            return ExitCode::from(2);
        }
    };
    let Ok((url, key, capacity, rate, n)) = parsed else {
        eprintln!("tb-headers: CAPACITY, RATE and N must be numbers");
        return ExitCode::from(2);
    };

    let result = redis::Client::open(url.as_str())
        .and_then(|client| client.get_connection_with_timeout(TIMEOUT))
        .and_then(|mut con| {
            con.set_read_timeout(Some(TIMEOUT))?;
            con.set_write_timeout(Some(TIMEOUT))?;
            take(&mut con, key.as_str(), capacity, rate, n)
        });

    match result {
        Ok(decision) => {
            println!("{}", if decision.allowed { 200 } else { 429 });
            for (name, value) in decision.headers(capacity, rate) {
                println!("{name}: {value}");
            }
        }
        Err(err) => {
            eprintln!("warning: rate limiter unavailable, failing open: {err}");
            println!("200");
        }
    }
    ExitCode::SUCCESS
}

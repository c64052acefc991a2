//! Runs the example against a real redis-server with the module loaded.

mod server;

use redis_tb_client_example::{take, Decision};
use server::RedisServer;
use std::process::Command;
use std::time::{Duration, Instant};

fn header<'a>(h: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
}

#[test]
fn burst_then_denial_with_headers() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let (capacity, rate) = (5.0, 1.0);

    // A full bucket lets the whole burst through, counting down.
    for expected in (0..5).rev() {
        let d = take(&mut con, "rl:burst", capacity, rate, 1.0).unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.remaining, expected);
        assert_eq!(d.retry_after_ms, 0);
        assert!(header(&d.headers(capacity, rate), "Retry-After").is_none());
    }

    // The next one is denied, with a wait of at most one token's refill time.
    let d = take(&mut con, "rl:burst", capacity, rate, 1.0).unwrap();
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.remaining, 0);
    assert!((1..=1000).contains(&d.retry_after_ms), "{d:?}");
    assert!((4000..=5000).contains(&d.reset_after_ms), "{d:?}");
    let h = d.headers(capacity, rate);
    assert_eq!(header(&h, "Retry-After"), Some("1"));
    assert_eq!(
        header(&h, "RateLimit"),
        Some("limit=5, remaining=0, reset=5")
    );
    assert_eq!(header(&h, "RateLimit-Policy"), Some("5;w=5"));

    // The bucket is a hash that expires when it would be full again.
    let pttl: i64 = redis::cmd("PTTL").arg("rl:burst").query(&mut con).unwrap();
    assert!(pttl > 0 && pttl <= 5000, "pttl {pttl}");
}

#[test]
fn retry_after_is_enough_to_be_allowed_again() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // One token every 50 ms.
    let (capacity, rate) = (2.0, 20.0);
    for _ in 0..2 {
        assert!(
            take(&mut con, "rl:retry", capacity, rate, 1.0)
                .unwrap()
                .allowed
        );
    }
    let denied = take(&mut con, "rl:retry", capacity, rate, 1.0).unwrap();
    assert!(!denied.allowed);
    let wait = denied.retry_after().expect("a finite wait");
    assert!(wait <= Duration::from_millis(50), "{wait:?}");
    std::thread::sleep(wait);
    let d = take(&mut con, "rl:retry", capacity, rate, 1.0).unwrap();
    assert!(d.allowed, "{d:?} after waiting {wait:?}");
}

#[test]
fn cost_above_capacity_can_never_succeed() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let d = take(&mut con, "rl:big", 5.0, 1.0, 6.0).unwrap();
    assert_eq!(
        d,
        Decision {
            allowed: false,
            remaining: 5,
            retry_after_ms: -1,
            reset_after_ms: 0
        }
    );
    assert!(d.can_never_succeed());
    assert_eq!(header(&d.headers(5.0, 1.0), "Retry-After"), None);
    // Nothing was written.
    let exists: bool = redis::cmd("EXISTS").arg("rl:big").query(&mut con).unwrap();
    assert!(!exists);
}

#[test]
fn argument_errors_come_back_as_errors() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let err = take(&mut con, "rl:err", 5.0, 0.0, 1.0).unwrap_err();
    assert_eq!(
        err.detail(),
        Some("rate must be a positive finite number"),
        "{err}"
    );
    let err = take(&mut con, "rl:err", f64::NAN, 1.0, 1.0).unwrap_err();
    assert_eq!(
        err.detail(),
        Some("capacity must be a positive finite number"),
        "{err}"
    );
}

#[test]
fn decisions_come_out_of_a_pipeline() {
    // Decision is a FromRedisValue, so it works with pipelines (and query_async).
    let server = RedisServer::start();
    let mut con = server.connection();
    let (a, b): (Decision, Decision) = redis::pipe()
        .add_command(redis_tb_client_example::take_cmd("rl:pipe", 3.0, 1.0, 2.0))
        .add_command(redis_tb_client_example::take_cmd("rl:pipe", 3.0, 1.0, 2.0))
        .query(&mut con)
        .unwrap();
    assert!(a.allowed && a.remaining == 1);
    assert!(!b.allowed && b.retry_after_ms > 0);
}

fn run_cli(url: &str, args: &[&str]) -> (String, String, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_tb-headers"))
        .arg(url)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        started.elapsed(),
    )
}

#[test]
fn command_line_example_and_fail_open() {
    let mut server = RedisServer::start();
    let url = server.url();

    // 2 requests of burst, one more every 10 s.
    let (out, _, _) = run_cli(&url, &["rl:cli", "2", "0.1"]);
    assert_eq!(
        out,
        "200\nRateLimit-Policy: 2;w=20\nRateLimit: limit=2, remaining=1, reset=10\n"
    );
    let (out, _, _) = run_cli(&url, &["rl:cli", "2", "0.1"]);
    assert!(out.starts_with("200\n"), "{out}");
    let (out, _, _) = run_cli(&url, &["rl:cli", "2", "0.1"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "429", "{out}");
    let retry: u64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("Retry-After: "))
        .unwrap_or_else(|| panic!("no Retry-After in {out}"))
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry), "{out}");

    // Redis gone: the request still goes through, quickly, with a warning.
    server.stop();
    let (out, err, took) = run_cli(&url, &["rl:cli", "2", "0.1"]);
    assert_eq!(out, "200\n");
    assert!(err.contains("failing open"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // And the library itself reports the outage as an error, not a decision.
    let client = redis::Client::open(url.as_str()).unwrap();
    let Err(err) = client.get_connection_with_timeout(Duration::from_millis(250)) else {
        panic!("connected to a stopped server");
    };
    assert!(err.is_connection_refusal() || err.is_io_error(), "{err}");
}

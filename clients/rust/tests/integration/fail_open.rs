//! Redis stopped, and hung (SIGSTOP): the middleware lets requests through
//! fast, without headers, logging once per outage; the plain API returns
//! the library's error fast and recovers without mixing up replies.

use crate::common::*;
use crate::web::{get, serve};
use redis_tb_client::{AsyncRateLimiter, RateLimitLayer, RateLimiter};
use std::time::{Duration, Instant};

const FAST: Duration = Duration::from_secs(1);

/// Requests until one comes back with rate-limit headers (the limiter is
/// up: before an outage, or after it once the connection is back).
async fn until_headers(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(addr, "/").await;
        assert_eq!(r.status, 200);
        if r.has_rate_limit_headers() {
            return;
        }
        assert!(Instant::now() < deadline, "the limiter never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first successful answer of `f` (the 200 ms default timeouts can miss
/// on a loaded machine right after a start or a SIGCONT).
fn first_ok<T>(mut f: impl FnMut() -> redis_tb_client::Result<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() > deadline => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn middleware_fails_open_while_stopped_and_logs_once() {
    let mut server = Server::with_module();
    let lines = Lines::default();
    let limiter = AsyncRateLimiter::from_client(server.client(), Default::default());
    let addr = serve(
        RateLimitLayer::new(limiter, 100, SLOW)
            .unwrap()
            .logger(lines.logger()),
    )
    .await;
    until_headers(addr).await;

    server.stop();
    for _ in 0..20 {
        let started = Instant::now();
        let r = get(addr, "/").await;
        assert!(started.elapsed() < FAST, "{:?}", started.elapsed());
        assert_eq!((r.status, r.body.as_str()), (200, "hello"));
        assert!(!r.has_rate_limit_headers(), "{:?}", r.headers);
    }
    assert_eq!(
        lines.count(log::Level::Warn, "unavailable"),
        1,
        "{:?}",
        lines.all()
    );

    server.restart();
    until_headers(addr).await;
    assert_eq!(
        lines.count(log::Level::Info, "available again"),
        1,
        "{:?}",
        lines.all()
    );
    assert_eq!(lines.count(log::Level::Warn, "unavailable"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn middleware_fails_open_while_hung_and_closed_when_asked() {
    let server = Server::with_module();
    let lines = Lines::default();
    let limiter = AsyncRateLimiter::from_client(server.client(), Default::default());
    let open = serve(
        RateLimitLayer::new(limiter.clone(), 100, SLOW)
            .unwrap()
            .logger(lines.logger()),
    )
    .await;
    let closed = serve(
        RateLimitLayer::new(limiter, 100, SLOW)
            .unwrap()
            .fail_open(false)
            .logger(Lines::default().logger()),
    )
    .await;
    until_headers(open).await;
    until_headers(closed).await;

    server.signal(libc::SIGSTOP);
    let outcome = async move {
        for _ in 0..10 {
            let started = Instant::now();
            let r = get(open, "/").await;
            assert!(started.elapsed() < FAST, "{:?}", started.elapsed());
            assert_eq!(r.status, 200);
            assert!(!r.has_rate_limit_headers());
        }
        let started = Instant::now();
        let r = get(closed, "/").await;
        assert!(started.elapsed() < FAST, "{:?}", started.elapsed());
        assert_eq!(r.status, 503);
    };
    let result = tokio::spawn(outcome).await;
    server.signal(libc::SIGCONT);
    result.unwrap();
    assert_eq!(
        lines.count(log::Level::Warn, "unavailable"),
        1,
        "{:?}",
        lines.all()
    );

    until_headers(open).await;
    assert_eq!(lines.count(log::Level::Info, "available again"), 1);
}

#[test]
fn sync_api_errors_fast_and_never_mixes_up_replies() {
    let mut server = Server::with_module();
    let mut l = RateLimiter::open(server.url()).unwrap();
    assert!(first_ok(|| l.take("a", 50, SLOW, 1)).remaining >= 40);

    server.signal(libc::SIGSTOP);
    let started = Instant::now();
    let e = l.take("a", 50, SLOW, 1).unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    // A new limiter cannot connect either (the handshake would hang): fast error.
    let mut fresh = RateLimiter::open(server.url()).unwrap();
    assert!(fresh.take("a", 50, SLOW, 1).unwrap_err().is_unavailable());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    server.signal(libc::SIGCONT);

    // The late reply for "a" is never read as the answer for "b".
    let d = l.take("b", 10, SLOW, 1).unwrap();
    assert_eq!(
        (d.allowed, d.remaining, d.policies[0].capacity),
        (true, 9, 10.0)
    );

    server.stop();
    let started = Instant::now();
    assert!(l.take("b", 10, SLOW, 1).unwrap_err().is_unavailable());
    assert!(started.elapsed() < FAST);
    server.restart();
    assert_eq!(
        l.take("b", 10, SLOW, 1).unwrap().remaining,
        9,
        "a new server, a new bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_api_times_out_fast_and_recovers() {
    let server = Server::with_module();
    let l = AsyncRateLimiter::connect_url(server.url()).await.unwrap();
    l.connect().await.unwrap();
    server.signal(libc::SIGSTOP);
    let started = Instant::now();
    let e = l.take("a", 50, SLOW, 1).await.unwrap_err();
    // Ours or the ConnectionManager's own response timeout, whichever fires first.
    assert!(e.is_unavailable(), "{e}");
    // A new limiter is made at once; its first call is unavailable.
    let fresh = AsyncRateLimiter::connect_url(server.url()).await.unwrap();
    let e = fresh.take("a", 50, SLOW, 1).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    server.signal(libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(20);
    let d = loop {
        match l.take("b", 10, SLOW, 1).await {
            Ok(d) => break d,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((d.allowed, d.remaining), (true, 9));
}

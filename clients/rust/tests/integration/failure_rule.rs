//! The one failure rule (docs/clients.md#the-failure-rule): outages fail
//! fast and open (or closed), bugs never fail open, a changed server is
//! detected again, and startup is not special.

use crate::api::GENEROUS;
use crate::common::*;
use crate::web::{get, get_with, serve, x_user};
use redis_tb_client::{AsyncRateLimiter, Backend, Error, Policy, RateLimitLayer, RateLimiter};
use std::time::{Duration, Instant};

/// The first answer of `f` that is not an outage (a restarted server drops
/// the old connection: the first call after it is unavailable).
fn first_ok<T>(mut f: impl FnMut() -> redis_tb_client::Result<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if e.is_unavailable() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_limiter_goes_on_with_lua_when_the_module_is_gone_and_moves_back_when_it_returns() {
    let mut server = Server::with_module();
    let lines = Lines::default();
    let mut l = RateLimiter::from_client(server.client(), GENEROUS)
        .with_logger(lines.logger())
        .with_module_recheck(Duration::ZERO);
    assert!(l.take("gone", 5, SLOW, 1).unwrap().allowed);
    assert_eq!(l.backend(), Some(Backend::Module));

    server.restart_with_module(false);
    let d = first_ok(|| l.take("gone", 5, SLOW, 1));
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 4),
        "a new server, a new bucket"
    );
    assert_eq!(l.backend(), Some(Backend::Function));
    assert_eq!(
        lines.count(log::Level::Warn, "the module is gone"),
        1,
        "{:?}",
        lines.all()
    );

    server.restart_with_module(true);
    let d = first_ok(|| l.take("gone", 5, SLOW, 1));
    assert_eq!(d.remaining, 4);
    assert_eq!(l.backend(), Some(Backend::Module));
    assert_eq!(
        lines.count(log::Level::Info, "the module is back"),
        1,
        "{:?}",
        lines.all()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_limiter_goes_on_with_lua_when_the_module_is_gone() {
    let mut server = Server::with_module();
    let lines = Lines::default();
    let l = AsyncRateLimiter::from_client(server.client(), GENEROUS).with_logger(lines.logger());
    assert!(l.take("gone", 5, SLOW, 1).await.unwrap().allowed);
    server.restart_with_module(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    let d = loop {
        match l.take("gone", 5, SLOW, 1).await {
            Ok(d) => break d,
            Err(e) if e.is_unavailable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(d.remaining, 4);
    assert_eq!(l.backend(), Some(Backend::Function));
    assert_eq!(
        lines.count(log::Level::Warn, "the module is gone"),
        1,
        "{:?}",
        lines.all()
    );
}

#[test]
fn the_middleware_refuses_invalid_policies_when_it_is_created() {
    let limiter = || {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        AsyncRateLimiter::from_client(client, Default::default())
    };
    for (capacity, rate) in [
        (0.0, 1.0),
        (5.0, -1.0),
        (f64::NAN, 1.0),
        (1e30, 1.0),
        (5.0, 0.0),
    ] {
        let made = RateLimitLayer::new(limiter(), capacity, rate);
        assert!(
            matches!(made, Err(Error::InvalidArgument(_))),
            "{capacity} {rate}"
        );
    }
    for policies in [
        vec![],
        vec![Policy::new("s\u{e9}c", 5, 1)],
        vec![Policy::new("sec", 5, 1), Policy::new("sec", 50, 1)],
    ] {
        let made = RateLimitLayer::all(limiter(), policies.clone());
        assert!(
            matches!(made, Err(Error::InvalidArgument(_))),
            "{policies:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bug_is_answered_500_and_logged_every_time_never_let_through() {
    let server = Server::with_module();
    let _: () = redis::cmd("SET")
        .arg("ratelimit:{u}:default")
        .arg("not a bucket")
        .query(&mut server.conn())
        .unwrap();
    let lines = Lines::default();
    let layer = RateLimitLayer::new(
        AsyncRateLimiter::from_client(server.client(), GENEROUS),
        5,
        1,
    )
    .unwrap()
    .key_fn(x_user)
    .cost_fn(|p| if p.uri.path() == "/search" { 1e30 } else { 1.0 })
    .logger(lines.logger());
    let addr = serve(layer.clone()).await;
    for _ in 0..2 {
        let r = get_with(addr, "/", &[("x-user", "u")]).await;
        assert_eq!(r.status, 500, "WRONGTYPE: {}", r.body);
        let r = get_with(addr, "/search", &[("x-user", "v")]).await;
        assert_eq!(r.status, 500, "a cost of 1e30: {}", r.body);
    }
    assert_eq!(
        lines.count(log::Level::Error, "WRONGTYPE"),
        2,
        "{:?}",
        lines.all()
    );
    assert_eq!(
        lines.count(log::Level::Error, "invalid argument"),
        2,
        "{:?}",
        lines.all()
    );
    assert_eq!(
        lines.count(log::Level::Warn, "unavailable"),
        0,
        "{:?}",
        lines.all()
    );
    assert_eq!(layer.unavailable_count(), 0);

    // A configured handler answers instead.
    let teapot = serve(layer.on_error(|e| {
        let mut r = http::Response::new(format!("{e}"));
        *r.status_mut() = http::StatusCode::IM_A_TEAPOT;
        r
    }))
    .await;
    let r = get_with(teapot, "/", &[("x-user", "u")]).await;
    assert_eq!(r.status, 418);
    assert!(r.body.contains("WRONGTYPE"), "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_at_once_and_is_counted_and_logged_once() {
    // Timeouts of seconds: waiting out even one would take longer than the bound.
    let down = redis::Client::open(format!("redis://127.0.0.1:{}/", free_port())).unwrap();
    let mut sync = RateLimiter::from_client(down.clone(), GENEROUS);
    let started = Instant::now();
    for _ in 0..5 {
        assert!(sync.take("k", 5, 1, 1).unwrap_err().is_unavailable());
    }
    assert!(
        started.elapsed() < GENEROUS.connect / 2,
        "{:?}",
        started.elapsed()
    );

    let limiter = AsyncRateLimiter::from_client(down, GENEROUS);
    let started = Instant::now();
    for _ in 0..5 {
        assert!(limiter
            .take("k", 5, 1, 1)
            .await
            .unwrap_err()
            .is_unavailable());
    }
    assert!(
        started.elapsed() < GENEROUS.connect / 2,
        "{:?}",
        started.elapsed()
    );

    let lines = Lines::default();
    let layer = RateLimitLayer::new(limiter, 5, 1)
        .unwrap()
        .logger(lines.logger());
    let addr = serve(layer.clone()).await;
    for _ in 0..4 {
        let r = get(addr, "/").await;
        assert_eq!((r.status, r.has_rate_limit_headers()), (200, false));
    }
    assert_eq!(layer.unavailable_count(), 4);
    assert_eq!(
        lines.count(log::Level::Warn, "unavailable"),
        1,
        "{:?}",
        lines.all()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_made_while_the_server_is_down_works_once_it_is_up() {
    let mut server = Server::not_started(true);
    let mut sync = RateLimiter::open(server.url()).unwrap();
    let limiter = AsyncRateLimiter::connect_url(server.url()).await.unwrap();
    assert!(sync.take("k", 5, SLOW, 1).unwrap_err().is_unavailable());
    assert!(limiter
        .take("k", 5, SLOW, 1)
        .await
        .unwrap_err()
        .is_unavailable());
    let addr = serve(RateLimitLayer::new(limiter.clone(), 5, SLOW).unwrap()).await;
    assert_eq!(get(addr, "/").await.status, 200);

    server.restart();
    assert_eq!(first_ok(|| sync.take("k", 5, SLOW, 1)).remaining, 4);
    let deadline = Instant::now() + Duration::from_secs(20);
    let d = loop {
        match limiter.take("k", 5, SLOW, 1).await {
            Ok(d) => break d,
            Err(e) if e.is_unavailable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!((d.remaining, limiter.backend()), (3, Some(Backend::Module)));
}

#[test]
fn a_call_that_timed_out_during_a_hang_is_still_charged_when_the_server_resumes() {
    // What the README and docs/clients.md warn about: it cannot be prevented
    // once the command is on the wire.
    let server = Server::with_module();
    let mut l = RateLimiter::open(server.url()).unwrap();
    assert_eq!(first_ok(|| l.take("hang", 10, SLOW, 1)).remaining, 9);
    server.signal(libc::SIGSTOP);
    let e = l.take("hang", 10, SLOW, 4).unwrap_err();
    server.signal(libc::SIGCONT);
    assert!(e.is_unavailable(), "{e}");
    let mut check = RateLimiter::from_client(server.client(), GENEROUS);
    assert_eq!(
        check.peek("hang", 10, SLOW, 0).unwrap().remaining,
        5,
        "charged anyway"
    );
}

#[test]
fn an_error_reply_to_command_info_means_no_module() {
    let server = Server::with_module();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "limited", "on", "nopass", "~*", "+@all", "-command",
            ][..],
        )
        .query(&mut server.conn())
        .unwrap();
    // nopass: any password logs in as `limited`.
    let url = format!("redis://limited:any@127.0.0.1:{}/", server.port);
    let mut l = RateLimiter::from_client(redis::Client::open(url).unwrap(), GENEROUS);
    // As in Python and Node: the limiter goes on with the function library.
    assert_eq!(l.take("acl", 5, SLOW, 1).unwrap().remaining, 4);
    assert_eq!(l.backend(), Some(Backend::Function));
}

/// Issue 26: the Lua fallback that `auto` chose because the module is
/// missing is a warning, as in Python and Node; the module is an info line.
#[test]
fn the_lua_fallback_is_logged_at_warning_level() {
    for server in Server::both() {
        let lines = Lines::default();
        let mut limiter =
            RateLimiter::from_client(server.client(), GENEROUS).with_logger(lines.logger());
        limiter.take("fallback", 1, 1, 1).unwrap();
        let (level, name) = if server.module {
            (log::Level::Info, "redis-tb backend: module")
        } else {
            (log::Level::Warn, "redis-tb backend: function")
        };
        assert_eq!(lines.count(level, name), 1, "{:?}", lines.all());
    }
}

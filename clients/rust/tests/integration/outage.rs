//! Issue 26 on real servers: a dropped connection is not an outage (one
//! resend, sync and async), the local limiter while Redis is down and Redis
//! again when it is back, and the denial cache under a flood, counted with
//! `INFO commandstats`.

use crate::api::GENEROUS;
use crate::common::*;
use crate::web::{get_with, serve};
use redis_tb_client::{
    AsyncRateLimiter, Error, LayerOnUnavailable, Limit, OnUnavailable, RateLimitLayer, RateLimiter,
    Source, Timeouts,
};
use std::time::{Duration, Instant};

/// The calls of `command` (`tb.take`, `fcall`) the server has counted.
fn calls(server: &Server, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The command a take is on `server`'s backend.
fn take_command(server: &Server) -> &'static str {
    if server.module {
        "tb.take"
    } else {
        "fcall"
    }
}

const UP: &str = "redis-tb: Redis unreachable (";
const DOWN_AT_HALF: &str = "limiting in process at 1/2 of each limit";
const BACK: &str = "redis-tb: Redis reachable again; limits come from Redis";

#[test]
fn a_restart_between_two_calls_is_not_an_outage_sync() {
    for mut server in Server::both() {
        let mut limiter = RateLimiter::from_client(server.client(), GENEROUS);
        assert!(limiter.take("restart", 10, SLOW, 1).unwrap().allowed);
        server.restart();
        // Before issue 26: Err(Unavailable("unexpected end of file")), then Ok.
        let d = limiter.take("restart", 10, SLOW, 1).unwrap();
        assert_eq!((d.allowed, d.source()), (true, Source::Server));
        // A refund is not sent again: given twice it would hand out tokens.
        server.restart();
        assert!(matches!(
            limiter.refund("restart", 10, SLOW, 1),
            Err(Error::Unavailable(_))
        ));
        assert!(limiter.refund("restart", 10, SLOW, 1).is_ok());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_two_calls_is_not_an_outage_async() {
    for mut server in Server::both() {
        let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        assert!(limiter.take("restart", 10, SLOW, 1).await.unwrap().allowed);
        server.restart();
        let d = limiter.take("restart", 10, SLOW, 1).await.unwrap();
        assert_eq!((d.allowed, d.source()), (true, Source::Server));
    }
}

/// Takes until one comes from Redis again (the first after the probe
/// interval, once the connection is back).
fn until_server(mut take: impl FnMut() -> redis_tb_client::Decision) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while take().source() != Source::Server {
        assert!(
            Instant::now() < deadline,
            "limits never came from Redis again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_local_limiter_limits_while_redis_is_down_sync() {
    let mut server = Server::with_module();
    let lines = Lines::default();
    let mut limiter = RateLimiter::from_client(server.client(), Timeouts::default())
        .with_logger(lines.logger())
        .on_unavailable(OnUnavailable::Local)
        .instances(2)
        .local_probe_ms(200);
    for _ in 0..10 {
        let d = limiter.take("outage", 20, SLOW, 1).unwrap();
        assert_eq!((d.allowed, d.source()), (true, Source::Server));
    }
    server.stop();
    let mut allowed = 0;
    for _ in 0..100 {
        let d = limiter.take("outage", 20, SLOW, 1).unwrap();
        assert_eq!(d.source(), Source::Local);
        allowed += usize::from(d.allowed);
    }
    // At most capacity / instances (the rate refills nothing meanwhile).
    assert_eq!(allowed, 10);
    let peek = limiter.peek("outage", 20, SLOW, 1).unwrap();
    assert_eq!((peek.allowed, peek.source()), (false, Source::Local));
    let all = [
        Limit::new("{u}:sec", 4, SLOW).name("sec"),
        Limit::new("{u}:day", 2, SLOW).name("day"),
    ];
    let d = limiter.take_all(&all).unwrap();
    assert_eq!((d.allowed, d.remaining, d.index), (true, 0, Some(1)));
    // What the local limiter does not serve stays unavailable.
    let charge = limiter.charge(&Limit::new("outage", 20, SLOW), 1, None);
    assert!(matches!(charge, Err(Error::Unavailable(_))), "{charge:?}");
    assert_eq!(lines.count(log::Level::Warn, UP), 1, "{:?}", lines.all());
    assert_eq!(lines.count(log::Level::Warn, DOWN_AT_HALF), 1);

    server.restart();
    until_server(|| limiter.take("outage", 20, SLOW, 1).unwrap());
    // Redis again: its bucket (a fresh server: full), not the local one.
    let d = limiter.take("outage", 20, SLOW, 1).unwrap();
    assert_eq!((d.source(), d.remaining), (Source::Server, 18));
    assert_eq!(lines.count(log::Level::Warn, BACK), 1, "{:?}", lines.all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_limiter_limits_while_redis_is_down_async_and_in_the_middleware() {
    let mut server = Server::without_module();
    let lines = Lines::default();
    let limiter = AsyncRateLimiter::from_client(server.client(), Timeouts::default())
        .with_logger(lines.logger())
        .on_unavailable(OnUnavailable::Local)
        .instances(2)
        .local_probe_ms(200);
    for _ in 0..10 {
        let d = limiter.take("outage", 20, SLOW, 1).await.unwrap();
        assert_eq!(d.source(), Source::Server);
    }
    // The middleware's Local uses a limiter that itself raises.
    let plain = AsyncRateLimiter::from_client(server.client(), Timeouts::default()).instances(2);
    let layer = RateLimitLayer::new(plain, 4, SLOW)
        .unwrap()
        .key_fn(crate::web::x_user)
        .on_unavailable(LayerOnUnavailable::Local);
    let addr = serve(layer).await;
    let user = [("x-user", "bob")];
    assert_eq!(get_with(addr, "/", &user).await.status, 200);

    server.stop();
    let mut allowed = 0;
    for _ in 0..100 {
        let d = limiter.take("outage", 20, SLOW, 1).await.unwrap();
        assert_eq!(d.source(), Source::Local);
        allowed += usize::from(d.allowed);
    }
    assert_eq!(allowed, 10);
    assert_eq!(lines.count(log::Level::Warn, DOWN_AT_HALF), 1);
    let statuses: Vec<u16> = {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(get_with(addr, "/", &user).await.status);
        }
        out
    };
    // 4 / 2 in process: two through, then 429 (not fail open).
    assert_eq!(statuses, [200, 200, 429, 429]);

    server.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    while limiter.take("outage", 20, SLOW, 1).await.unwrap().source() != Source::Server {
        assert!(
            Instant::now() < deadline,
            "limits never came from Redis again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines.count(log::Level::Warn, BACK), 1, "{:?}", lines.all());
}

#[test]
fn a_flood_by_one_id_reaches_redis_once_per_retry_window() {
    for server in Server::both() {
        let mut limiter = RateLimiter::from_client(server.client(), GENEROUS).cache_denials(true);
        // 5 of burst, 2 per second: one token back every 500 ms, the retry window.
        let window_ms = 500;
        for _ in 0..5 {
            assert!(limiter.take("flood", 5, 2, 1).unwrap().allowed);
        }
        let before = calls(&server, take_command(&server));
        let started = Instant::now();
        let mut cached = 0;
        // 10,000 takes spread over a few windows (a pause after each).
        for _ in 0..10_000 {
            let d = limiter.take("flood", 5, 2, 1).unwrap();
            if d.source() == Source::Cache {
                assert!(!d.allowed && d.retry_after_ms >= 1, "{d:?}");
                cached += 1;
            }
            std::thread::sleep(Duration::from_micros(250));
        }
        let windows = started.elapsed().as_millis() as u64 / window_ms + 1;
        let sent = calls(&server, take_command(&server)) - before;
        eprintln!(
            "flood on {}: {sent} server calls in {windows} windows",
            take_command(&server)
        );
        // Each window: only the take that finds its token back, whose reply
        // (no token left) the cache answers as a denial until the next
        // token; one more for the window edge.
        assert!(
            windows >= 4 && sent <= windows + 1,
            "{sent} takes reached the server in {windows} windows ({} backend)",
            take_command(&server)
        );
        assert!(cached >= 10_000 - (windows + 1), "{cached}");
        // A refund through this limiter drops the key's entry.
        limiter.refund("flood", 5, 2, 1).unwrap();
        let d = limiter.take("flood", 5, 2, 1).unwrap();
        assert_eq!((d.allowed, d.source()), (true, Source::Server));
    }
}

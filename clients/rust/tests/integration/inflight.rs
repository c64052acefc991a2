//! ConcurrencyLimitLayer in axum, through real HTTP requests: the lease is
//! held while a request runs (renewed past lease_ms), released when the
//! body is done or the future dropped; 429 or 503 with the headers; fail
//! open and closed with the server down; hostile ids keep one hash tag.

use crate::api::GENEROUS;
use crate::common::*;
use crate::leases::lease_servers;
use crate::web::{get, get_with, serve_app, x_user};
use axum::routing::get as route_get;
use axum::Router;
use redis_tb_client::{
    AsyncRateLimiter, ConcurrencyLimitLayer, Error, RateLimitLayer, Timeouts, QUOTA_EXCEEDED,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// Holds `/slow` requests until the test opens it (`notify_one`, once per request):
/// a request in flight for as long as the test needs, however slow the machine.
pub(crate) type Gate = Arc<tokio::sync::Notify>;

/// The app the tests limit: `/` answers at once, `/slow` once its gate opens.
pub(crate) fn routes() -> (Router, Gate) {
    let gate = Gate::default();
    let held = gate.clone();
    let app = Router::new()
        .route("/", route_get(|| async { "hello" }))
        .route(
            "/slow",
            route_get(|| async move {
                held.notified().await;
                "slow"
            }),
        );
    (app, gate)
}

async fn serve_in_flight<C>(layer: ConcurrencyLimitLayer<C>) -> (SocketAddr, Gate)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let (app, gate) = routes();
    (serve_app(app.layer(layer)).await, gate)
}

fn live(server: &Server, key: &str) -> i64 {
    let n: i64 = redis::cmd("ZCARD")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    // The seq and inc members are not leases.
    (n - 2).max(0)
}

async fn until_live(server: &Server, key: &str, want: i64) {
    let started = Instant::now();
    while live(server, key) != want {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{key}: {} live, want {want}",
            live(server, key)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const USER: [(&str, &str); 1] = [("x-user", "alice")];
const KEY: &str = "ratelimit:{alice}:inflight";

fn layer_for(
    server: &Server,
    lease_ms: u64,
) -> ConcurrencyLimitLayer<redis_tb_client::LazyConnectionManager> {
    let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS);
    ConcurrencyLimitLayer::new(limiter, 1, lease_ms)
        .unwrap()
        .key_fn(x_user)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_limit_denies_with_429_and_headers_then_frees_the_slot() {
    for server in lease_servers() {
        let (addr, gate) = serve_in_flight(layer_for(&server, 30_000)).await;
        let slow = tokio::spawn(async move { get_with(addr, "/slow", &USER).await });
        until_live(&server, KEY, 1).await;

        let denied = get_with(addr, "/", &USER).await;
        assert_eq!(denied.status, 429);
        assert_eq!(
            denied.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(
            denied.header("ratelimit-policy"),
            Some("\"inflight\";q=1;qu=\"concurrent-requests\"")
        );
        assert_eq!(denied.header("ratelimit"), None, "only RateLimit-Policy");
        // 30 s lease, a few ms old: rounded up to 30.
        assert_eq!(denied.header("retry-after"), Some("30"));
        let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
        assert_eq!(body["type"], QUOTA_EXCEEDED);
        assert_eq!(body["status"], 429);
        assert_eq!(body["title"], "Too Many Requests");
        assert_eq!(body["violated-policies"][0], "inflight");

        // Another caller has its own slots; a request without id is not limited.
        assert_eq!(get_with(addr, "/", &[("x-user", "bob")]).await.status, 200);
        assert_eq!(get(addr, "/").await.status, 200);

        gate.notify_one();
        let done = slow.await.unwrap();
        assert_eq!((done.status, done.body.as_str()), (200, "slow"));
        assert_eq!(
            done.header("ratelimit-policy"),
            Some("\"inflight\";q=1;qu=\"concurrent-requests\"")
        );
        assert_eq!(done.header("ratelimit"), None);
        // Released once its body was sent.
        until_live(&server, KEY, 0).await;
        let again = get_with(addr, "/", &USER).await;
        assert_eq!(again.status, 200);
        assert!(again.header("ratelimit-policy").is_some());
        until_live(&server, KEY, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_status_503_and_renewal_past_lease_ms() {
    for server in lease_servers() {
        // lease_ms 1000 < the request, held 1.5 s: renewed while it runs (every 333
        // ms, so a pause of up to 667 ms of a loaded machine still finds it live).
        let layer = layer_for(&server, 1000).deny_status(http::StatusCode::SERVICE_UNAVAILABLE);
        let (addr, gate) = serve_in_flight(layer).await;
        let slow = tokio::spawn(async move { get_with(addr, "/slow", &USER).await });
        until_live(&server, KEY, 1).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let denied = get_with(addr, "/", &USER).await;
        assert_eq!(
            denied.status, 503,
            "still held past lease_ms: {}",
            denied.body
        );
        assert_eq!(
            denied.header("ratelimit-policy"),
            Some("\"inflight\";q=1;qu=\"concurrent-requests\"")
        );
        assert_eq!(denied.header("retry-after"), Some("1"));
        let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
        assert_eq!(body["status"], 503);
        gate.notify_one();
        assert_eq!(slow.await.unwrap().status, 200);
        until_live(&server, KEY, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_request_future_releases_its_lease() {
    let server = Server::with_module();
    let app = Router::new()
        .route(
            "/",
            route_get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "never"
            }),
        )
        .layer(layer_for(&server, 30_000));
    let request = || {
        http::Request::builder()
            .uri("/")
            .header("x-user", "alice")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let call = app.clone().oneshot(request());
    assert!(tokio::time::timeout(Duration::from_millis(300), call)
        .await
        .is_err());
    until_live(&server, KEY, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_ids_keep_one_hash_tag() {
    let server = Server::with_module();
    let (addr, gate) = serve_in_flight(layer_for(&server, 30_000)).await;
    let slow = tokio::spawn(async move { get_with(addr, "/slow", &[("x-user", "}x{")]).await });
    until_live(&server, "ratelimit:{%7Dx%7B}:inflight", 1).await;
    gate.notify_one();
    assert_eq!(slow.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_open_or_closed_with_the_server_down() {
    let server = Server::not_started(true);
    let lines = Lines::default();
    let limiter = AsyncRateLimiter::from_client(server.client(), Timeouts::default());
    let open = ConcurrencyLimitLayer::new(limiter.clone(), 1, 1000)
        .unwrap()
        .logger(lines.logger());
    let (addr, _) = serve_in_flight(open.clone()).await;
    for _ in 0..3 {
        let started = Instant::now();
        let r = get(addr, "/").await;
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!((r.status, r.body.as_str()), (200, "hello"));
        assert!(!r.has_rate_limit_headers(), "{:?}", r.headers);
    }
    assert_eq!(open.unavailable_count(), 3);
    let warnings = lines
        .all()
        .into_iter()
        .filter(|(l, m)| *l == log::Level::Warn && m.contains("unavailable"))
        .count();
    assert_eq!(warnings, 1, "{:?}", lines.all());

    let closed = ConcurrencyLimitLayer::new(limiter, 1, 1000)
        .unwrap()
        .fail_open(false);
    let (addr, _) = serve_in_flight(closed).await;
    assert_eq!(get(addr, "/").await.status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bug_is_never_let_through_and_layers_compose() {
    let server = Server::with_module();
    // The key holds a string: WRONGTYPE is a bug, answered 500.
    let _: () = redis::cmd("SET")
        .arg(KEY)
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    let (addr, _) = serve_in_flight(layer_for(&server, 30_000)).await;
    assert_eq!(get_with(addr, "/", &USER).await.status, 500);

    // A rate limit beside an in-flight limit, either one outside: ONE
    // RateLimit-Policy line, the rate policy first (issue 26: it was two
    // lines, in-flight first).
    let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS);
    let rate = RateLimitLayer::new(limiter, 10, SLOW).unwrap();
    let in_flight = rate.concurrency(5, 30_000).unwrap();
    let route = || Router::new().route("/", route_get(|| async { "hello" }));
    let rate_outside = route().layer(in_flight.clone()).layer(rate.clone());
    let in_flight_outside = route().layer(rate.clone()).layer(in_flight);
    for (app, peer) in [(rate_outside, 9), (in_flight_outside, 10)] {
        let request = http::Request::builder()
            .uri("/")
            .extension(SocketAddr::from(([127, 0, 0, peer], 1)))
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let policies: Vec<_> = response
            .headers()
            .get_all("ratelimit-policy")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            policies,
            ["\"default\";q=10;w=10000, \"inflight\";q=5;qu=\"concurrent-requests\""]
        );
    }
    assert!(matches!(
        ConcurrencyLimitLayer::named(
            AsyncRateLimiter::from_client(server.client(), GENEROUS),
            "x",
            0,
            1
        ),
        Err(Error::InvalidArgument(_))
    ));
    // Its name may not be a rate policy's: one key cannot be a bucket and a lease set.
    assert!(matches!(
        rate.concurrency_named("default", 5, 30_000),
        Err(Error::InvalidArgument(_))
    ));
    let per_inflight = RateLimitLayer::all(
        AsyncRateLimiter::from_client(server.client(), GENEROUS),
        vec![redis_tb_client::Policy::new("inflight", 10, SLOW)],
    )
    .unwrap();
    assert!(matches!(
        per_inflight.concurrency(5, 30_000),
        Err(Error::InvalidArgument(_))
    ));
    assert!(per_inflight
        .concurrency_named("in-flight", 5, 30_000)
        .is_ok());
}

/// The deadline of the one live lease at `key`, in ms from now (server clock).
fn lease_left_ms(server: &Server, key: &str) -> i64 {
    let mut con = server.conn();
    let scores: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut con)
        .unwrap();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let deadline = scores.iter().map(|(_, s)| *s as i64).max().unwrap();
    deadline - now_ms
}

/// Issue 26, "the same behaviour in all three": the in-flight limit is
/// checked before the rate (a request refused for concurrency spends no
/// token; a rate denial holds no lease after its 429), one `RateLimit-Policy`
/// line, and `lease_ms` defaults to 60 s; with the in-flight layer outside
/// (`in_flight_outside`) or inside the rate layer.
async fn in_flight_before_rate(in_flight_outside: bool) {
    let server = Server::with_module();
    let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS);
    let rate = RateLimitLayer::new(limiter, 3, SLOW)
        .unwrap()
        .key_fn(x_user);
    let in_flight = rate.in_flight(1).unwrap();
    // axum's last `.layer` is the outermost.
    let (routes, gate) = routes();
    let app = if in_flight_outside {
        routes.layer(rate).layer(in_flight)
    } else {
        routes.layer(in_flight).layer(rate)
    };
    let addr = serve_app(app).await;
    let bucket = "ratelimit:{alice}:default";
    let tokens = || {
        let mut sync = redis_tb_client::RateLimiter::new(server.conn());
        sync.peek(bucket, 3, SLOW, 0).unwrap().remaining
    };

    let slow = tokio::spawn(async move { get_with(addr, "/slow", &USER).await });
    until_live(&server, KEY, 1).await;
    let left = lease_left_ms(&server, KEY);
    assert!((50_000..=60_000).contains(&left), "{left} ms");
    let refused = get_with(addr, "/", &USER).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"inflight\";q=1;qu=\"concurrent-requests\"")
    );
    assert_eq!(refused.header("ratelimit"), None, "the in-flight 429 alone");
    assert_eq!(
        tokens(),
        2,
        "a request refused for concurrency spent a token"
    );
    gate.notify_one();
    let slow = slow.await.unwrap();
    assert_eq!(slow.status, 200);
    assert_eq!(
        slow.header("ratelimit-policy"),
        Some("\"default\";q=3;w=3000, \"inflight\";q=1;qu=\"concurrent-requests\"")
    );
    // Released once its body was sent: after the client has it, so wait for it.
    until_live(&server, KEY, 0).await;

    for _ in 0..2 {
        assert_eq!(get_with(addr, "/", &USER).await.status, 200);
        // Each lease goes back after its response reached the client: a next request
        // sent at once can still find it held (429 for concurrency on a busy machine).
        until_live(&server, KEY, 0).await;
    }
    assert_eq!(tokens(), 0);
    let denied = get_with(addr, "/", &USER).await;
    assert_eq!(denied.status, 429);
    assert!(denied.body.contains("\"violated-policies\": [\"default\"]"));
    // The rate denial holds no lease (released with its response, or never taken).
    until_live(&server, KEY, 0).await;
    assert_eq!(tokens(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_before_rate_with_the_in_flight_layer_outside() {
    in_flight_before_rate(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_before_rate_with_the_rate_layer_outside() {
    in_flight_before_rate(false).await;
}

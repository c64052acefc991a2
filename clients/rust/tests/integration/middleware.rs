//! The tower layer in axum, through real HTTP requests, on a server with
//! the module and one without: the same statuses, headers and bodies.

use crate::api::GENEROUS;
use crate::common::*;
use crate::web::{get, get_with, serve};
use redis_tb_client::{
    client_ip, AsyncRateLimiter, LazyConnectionManager, Policy, RateLimitLayer, QUOTA_EXCEEDED,
};
use tower::ServiceExt;

async fn limiter(server: &Server) -> AsyncRateLimiter<LazyConnectionManager> {
    AsyncRateLimiter::from_client(server.client(), GENEROUS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_on_allow_and_problem_json_on_deny() {
    let mut seen = Vec::new();
    for server in Server::both() {
        let addr = serve(RateLimitLayer::new(limiter(&server).await, 3, SLOW).unwrap()).await;
        let mut replies = Vec::new();
        for _ in 0..4 {
            replies.push(get(addr, "/").await);
        }
        for (i, r) in replies[..3].iter().enumerate() {
            assert_eq!(r.status, 200);
            assert_eq!(r.body, "hello");
            assert_eq!(r.header("ratelimit-policy"), Some("\"default\";q=3;w=3000"));
            assert_eq!(
                r.header("ratelimit"),
                Some(format!("\"default\";r={};t={}", 2 - i, (i + 1) * 1000).as_str())
            );
            assert_eq!(r.header("retry-after"), None);
        }
        let denied = &replies[3];
        assert_eq!(denied.status, 429);
        assert_eq!(
            denied.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(denied.header("retry-after"), Some("1000"));
        assert_eq!(denied.header("ratelimit"), Some("\"default\";r=0;t=3000"));
        let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
        assert_eq!(body["type"], QUOTA_EXCEEDED);
        assert_eq!(body["title"], "Too Many Requests");
        assert_eq!(body["status"], 429);
        assert_eq!(body["violated-policies"], serde_json::json!(["default"]));
        assert!(
            body["detail"].as_str().unwrap()
                == "Rate limit of policy \"default\" exceeded; retry in 1000 s.",
            "{body}"
        );
        // The bucket of this client: the loopback IP, in one hash tag.
        let mut con = server.conn();
        let exists: bool = redis::cmd("EXISTS")
            .arg("ratelimit:{127.0.0.1}:default")
            .query(&mut con)
            .unwrap();
        assert!(exists);
        seen.push(
            replies
                .iter()
                .map(|r| {
                    (
                        r.status,
                        r.headers.get("ratelimit").cloned(),
                        r.headers.get("retry-after").cloned(),
                        r.body.clone(),
                    )
                })
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(seen[0], seen[1], "module and Lua answer the same");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_and_cost_functions() {
    let server = Server::with_module();
    let layer = RateLimitLayer::all(
        limiter(&server).await,
        vec![Policy::new("per-user", 5, SLOW)],
    )
    .unwrap()
    .prefix("api:")
    .key_fn(|p| {
        p.headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(|u| format!("user:{u}"))
    })
    .cost_fn(|p| if p.uri.path() == "/search" { 3.0 } else { 1.0 });
    let addr = serve(layer).await;
    let alice = [("x-user", "alice")];
    let bob = [("x-user", "bob")];
    let r = get_with(addr, "/search", &alice).await;
    assert_eq!(
        (r.status, r.header("ratelimit")),
        (200, Some("\"per-user\";r=2;t=3000"))
    );
    let r = get_with(addr, "/search", &alice).await;
    assert_eq!(r.status, 429);
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["per-user"]));
    let r = get_with(addr, "/", &alice).await;
    assert_eq!(
        (r.status, r.header("ratelimit")),
        (200, Some("\"per-user\";r=1;t=4000"))
    );
    // Bob has his own bucket.
    let r = get_with(addr, "/search", &bob).await;
    assert_eq!(
        (r.status, r.header("ratelimit")),
        (200, Some("\"per-user\";r=2;t=3000"))
    );
    // No key: not limited, no headers.
    let r = get(addr, "/search").await;
    assert_eq!(r.status, 200);
    assert!(!r.has_rate_limit_headers());
    let exists: bool = redis::cmd("EXISTS")
        .arg("api:{user:alice}:per-user")
        .query(&mut server.conn())
        .unwrap();
    assert!(exists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_at_once() {
    let mut seen = Vec::new();
    for server in Server::both() {
        let policies = vec![Policy::new("sec", 10, SLOW), Policy::new("day", 2, SLOW)];
        let addr = serve(
            RateLimitLayer::all(limiter(&server).await, policies)
                .unwrap()
                .key_fn(|p| client_ip(p).map(|ip| format!("{ip}:{}", p.uri.path()))),
        )
        .await;
        let a = get(addr, "/").await;
        assert_eq!(a.status, 200);
        assert_eq!(
            a.header("ratelimit-policy"),
            Some("\"sec\";q=10;w=10000, \"day\";q=2;w=2000")
        );
        assert_eq!(a.header("ratelimit"), Some("\"day\";r=1;t=1000"));
        assert_eq!(get(addr, "/").await.status, 200);
        let denied = get(addr, "/").await;
        assert_eq!(denied.status, 429);
        let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
        assert_eq!(body["violated-policies"], serde_json::json!(["day"]));
        // Per route: /search has its own buckets.
        assert_eq!(get(addr, "/search").await.status, 200);
        let mut con = server.conn();
        let sec: String = redis::cmd("HGET")
            .arg("ratelimit:{127.0.0.1:/}:sec")
            .arg("tokens")
            .query(&mut con)
            .unwrap();
        assert!(sec.starts_with('8'), "{sec}: the denied call took nothing");
        seen.push((
            a.headers.get("ratelimit").cloned(),
            denied.body.clone(),
            denied.headers.get("retry-after").cloned(),
        ));
    }
    assert_eq!(seen[0], seen[1]);
}

#[tokio::test]
async fn as_a_plain_tower_service_with_oneshot() {
    let server = Server::without_module();
    let layer = RateLimitLayer::new(limiter(&server).await, 1, SLOW)
        .unwrap()
        .key_fn(|_| Some("one".into()));
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let request = || {
        http::Request::get("/")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let ok = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["ratelimit"], "\"default\";r=0;t=1000");
    let denied = app.oneshot(request()).await.unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["retry-after"], "1000");
}

/// Issue 26: the README's per-user example keys callers without the header
/// to one shared "anon" bucket: a request without it is limited, not let
/// through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_callers_share_one_limited_bucket() {
    let server = Server::with_module();
    let layer = RateLimitLayer::new(limiter(&server).await, 2, SLOW)
        .unwrap()
        .key_fn(|p| {
            let user = p.headers.get("x-user").and_then(|v| v.to_str().ok());
            Some(user.unwrap_or("anon").to_string())
        });
    let addr = serve(layer).await;
    let statuses = [
        get(addr, "/").await.status,
        get(addr, "/").await.status,
        get(addr, "/").await.status,
    ];
    assert_eq!(statuses, [200, 200, 429]);
    let exists: bool = redis::cmd("EXISTS")
        .arg("ratelimit:{anon}:default")
        .query(&mut server.conn())
        .unwrap();
    assert!(exists);
}

/// Issue 26: the default key writes an IPv4-mapped IPv6 peer as the IPv4
/// address, as the Python and Node libraries do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_key_normalises_ipv4_mapped_addresses() {
    let server = Server::with_module();
    let layer = RateLimitLayer::new(limiter(&server).await, 2, SLOW).unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello" }))
        .layer(layer);
    let mapped: std::net::SocketAddr = "[::ffff:127.0.0.1]:4000".parse().unwrap();
    let request = http::Request::builder()
        .uri("/")
        .extension(mapped)
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(request).await.unwrap().status(), 200);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("ratelimit:*")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(keys, ["ratelimit:{127.0.0.1}:default"]);
}

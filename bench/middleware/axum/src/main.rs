//! The axum app of `bench/middleware_bench.py`: the same four routes as the
//! other frameworks' apps.
//!   GET /bare      "ok", no middleware
//!   GET /get       one plain `GET bench:get` to the same Redis, then "ok"
//!   GET /module/x  "ok" behind the redis-tb layer on the module backend
//!   GET /lua/x     the same on the Lua backend (FUNCTION library)
//! The policy never denies (capacity and rate 1e9): the allow path is what
//! every request of a healthy service takes. Env: REDIS_URL, PORT.
use axum::{routing::get, Router};
use redis_tb_client::redis::{self, AsyncCommands};
use redis_tb_client::{AsyncRateLimiter, Backend, RateLimitLayer};
use std::net::SocketAddr;

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").expect("REDIS_URL");
    let port: u16 = std::env::var("PORT").expect("PORT").parse().expect("PORT");
    let client = redis::Client::open(url.as_str()).expect("REDIS_URL");
    let con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");

    let module = AsyncRateLimiter::connect_url(url.as_str())
        .await
        .expect("limiter")
        .with_backend(Backend::Module);
    let lua = AsyncRateLimiter::connect_url(url.as_str())
        .await
        .expect("limiter")
        .with_backend(Backend::Function);
    module.connect().await.expect("module backend");
    lua.connect().await.expect("function backend");

    let plain = Router::new().route("/bare", get(|| async { "ok" })).route(
        "/get",
        get(move || {
            let mut con = con.clone();
            async move {
                let _: Option<String> = con.get("bench:get").await.expect("GET");
                "ok"
            }
        }),
    );
    let limited = |limiter| {
        Router::new()
            .route("/x", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter, 1e9, 1e9).expect("policy"))
    };
    let app = plain
        .nest("/module", limited(module))
        .nest("/lua", limited(lua));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    println!("listening on {port}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("serve");
}

//! The axum app of `bench/middleware_bench.py`: the same four routes as the
//! other frameworks' apps, each a nested Router of its own, so that they
//! differ only by the GET or the layer.
//!   GET /bare/x    "ok", no middleware
//!   GET /get/x     one plain `GET bench:get` to the same Redis, then "ok"
//!   GET /module/x  "ok" behind the redis-tb layer on the module backend
//!   GET /lua/x     the same on the Lua backend (FUNCTION library)
//! The policy never denies (capacity and rate 1e9): the allow path is what
//! every request of a healthy service takes. Env: REDIS_URL, PORT.
//!
//! `tb-mw-bench-axum breakdown N ROUNDS` instead prints, as JSON, µs per call
//! without HTTP (median over ROUNDS of the mean of N sequential calls): one
//! GET on the MultiplexedConnection, one `take` on the limiter.
use axum::{routing::get, Router};
use redis_tb_client::redis::{self, AsyncCommands};
use redis_tb_client::{AsyncRateLimiter, Backend, RateLimitLayer};
use std::net::SocketAddr;
use std::time::Instant;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

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

    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("breakdown") {
        let n: u32 = args[2].parse().expect("N");
        let rounds: usize = args[3].parse().expect("ROUNDS");
        // On a worker thread, as a handler runs (the main thread's block_on
        // would add a cross-thread wake-up to every reply).
        let (con, module) = (con.clone(), module.clone());
        let line = tokio::spawn(async move {
            let mut get_us = Vec::new();
            let mut take_us = Vec::new();
            for _ in 0..rounds {
                let mut c = con.clone();
                let t0 = Instant::now();
                for _ in 0..n {
                    let _: Option<String> = c.get("bench:get").await.expect("GET");
                }
                get_us.push(t0.elapsed().as_secs_f64() * 1e6 / f64::from(n));
                let t0 = Instant::now();
                for _ in 0..n {
                    module
                        .take("ratelimit:{127.0.0.1}:default", 1e9, 1e9, 1.0)
                        .await
                        .expect("take");
                }
                take_us.push(t0.elapsed().as_secs_f64() * 1e6 / f64::from(n));
            }
            format!(
                "{{\"get\": {}, \"take\": {}}}",
                median(get_us),
                median(take_us)
            )
        })
        .await
        .expect("breakdown");
        println!("{line}");
        return;
    }

    let bare = Router::new().route("/x", get(|| async { "ok" }));
    let one_get = Router::new().route(
        "/x",
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
    let app = Router::new()
        .nest("/bare", bare)
        .nest("/get", one_get)
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

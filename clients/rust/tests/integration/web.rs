//! An axum app behind the layer, served on a free loopback port, and a
//! minimal HTTP/1.1 client for it.

use axum::http::request::Parts;
use axum::routing::get as route_get;
use axum::Router;
use redis_tb_client::RateLimitLayer;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct Reply {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_lowercase()).map(String::as_str)
    }
    pub fn has_rate_limit_headers(&self) -> bool {
        self.header("ratelimit").is_some() || self.header("ratelimit-policy").is_some()
    }
}

/// The key function of tests that name the caller in an `x-user` header.
pub fn x_user(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

pub async fn serve<C>(layer: RateLimitLayer<C>) -> SocketAddr
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let app = Router::new()
        .route("/", route_get(|| async { "hello" }))
        .route("/search", route_get(|| async { "results" }))
        .layer(layer);
    serve_app(app).await
}

/// Serves `app` on a free loopback port, with the peer address as
/// `ConnectInfo` (what the layers' default key function reads).
pub async fn serve_app(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

pub async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_lowercase(), v.to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    get_with(addr, path, &[]).await
}

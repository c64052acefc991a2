//! A `tower::Layer` (feature `tower`) that rate-limits HTTP requests: usable
//! with axum (`Router::layer`), hyper and any tower stack over `http` 1.

use crate::aio::AsyncRateLimiter;
use crate::backend::{emit, Logger};
use crate::decision::{sf_string, Decision, Limit, Policy};
use crate::error::Error;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// The caller's identity from the request: `None` lets the request through
/// unlimited (e.g. health checks).
pub type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
/// The request's cost in tokens (default 1).
pub type CostFn = Arc<dyn Fn(&Parts) -> f64 + Send + Sync>;

/// The `type` of the 429 problem document (RFC 9457).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The client IP, from a `SocketAddr` or `IpAddr` request extension (what
/// plain hyper/tower servers can insert), or from axum's
/// `ConnectInfo<SocketAddr>` (served with `into_make_service_with_connect_info`).
/// `None` when unknown.
pub fn client_ip(parts: &Parts) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip());
    }
    if let Some(addr) = parts.extensions.get::<SocketAddr>() {
        return Some(addr.ip());
    }
    parts.extensions.get::<IpAddr>().copied()
}

/// For key functions: the IP of an extension of type `T` that dereferences
/// to a `SocketAddr`, e.g. axum's `ConnectInfo<SocketAddr>`:
/// `connect_info_ip::<ConnectInfo<SocketAddr>>(parts)`.
pub fn connect_info_ip<T>(parts: &Parts) -> Option<IpAddr>
where
    T: std::ops::Deref<Target = SocketAddr> + Send + Sync + 'static,
{
    parts.extensions.get::<T>().map(|c| c.ip())
}

struct Outage {
    failing: AtomicBool,
}

impl Clone for Outage {
    fn clone(&self) -> Self {
        Outage {
            failing: AtomicBool::new(self.failing.load(Ordering::SeqCst)),
        }
    }
}

#[derive(Clone)]
struct Shared<C> {
    limiter: AsyncRateLimiter<C>,
    policies: Vec<Policy>,
    key_fn: KeyFn,
    cost_fn: CostFn,
    prefix: String,
    fail_open: bool,
    logger: Option<Logger>,
    outage: Outage,
}

/// The rate-limiting layer: one limit ([`RateLimitLayer::new`]) or several
/// at once ([`RateLimitLayer::all`], TB.TAKEALL: all or nothing).
///
/// The bucket of policy `name` for caller `id` is `<prefix>{<id>}:<name>`
/// (prefix default `"ratelimit:"`, as in the Python library): one hash tag per caller, so all its buckets
/// share a cluster slot. The caller id comes from the key function (default:
/// the client IP, see [`client_ip`]; a request without one is not limited).
///
/// On allow the request goes through and the response gets the
/// `RateLimit-Policy` / `RateLimit` headers; on deny the answer is 429
/// `application/problem+json` with the headers and `Retry-After`. When the
/// limiter fails (Redis down, hung, erroring) the request goes through
/// without headers (fail open, the default) or gets a 503 (fail closed); one
/// warning is logged when failures start and one info line when calls
/// succeed again.
pub struct RateLimitLayer<C> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

fn default_key(parts: &Parts) -> Option<String> {
    client_ip(parts).map(|ip| ip.to_string())
}

impl<C> RateLimitLayer<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One limit: `capacity` tokens refilled at `rate` per second, policy
    /// name `"default"` (see [`policy_name`](Self::policy_name)).
    pub fn new(
        limiter: AsyncRateLimiter<C>,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
    ) -> Self {
        Self::all(limiter, vec![Policy::new("default", capacity, rate)])
    }

    /// Several limits at once; each [`Policy`] names its bucket and headers.
    pub fn all(limiter: AsyncRateLimiter<C>, policies: Vec<Policy>) -> Self {
        let logger = limiter.logger().clone();
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                policies,
                key_fn: Arc::new(default_key),
                cost_fn: Arc::new(|_| 1.0),
                prefix: "ratelimit:".into(),
                fail_open: true,
                logger,
                outage: Outage {
                    failing: AtomicBool::new(false),
                },
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Shared<C>)) -> Self {
        // A layer cloned before this call keeps its own settings.
        f(Arc::make_mut(&mut self.shared));
        self
    }

    /// The caller's identity (default: client IP). Per user:
    /// `|p| p.headers.get("x-user").and_then(|v| v.to_str().ok()).map(String::from)`;
    /// per route and IP: `|p| client_ip(p).map(|ip| format!("{ip}:{}", p.uri.path()))`.
    pub fn key_fn(self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.edit(|s| s.key_fn = Arc::new(f))
    }

    /// The request's cost in tokens (default 1), taken from every limit.
    pub fn cost_fn(self, f: impl Fn(&Parts) -> f64 + Send + Sync + 'static) -> Self {
        self.edit(|s| s.cost_fn = Arc::new(f))
    }

    /// Renames the policy of a one-limit layer (headers, bucket key).
    pub fn policy_name(self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.edit(|s| {
            if let Some(p) = s.policies.first_mut() {
                p.name = name;
            }
        })
    }

    /// The bucket key prefix (default `"ratelimit:"`).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.edit(|s| s.prefix = prefix)
    }

    /// `false`: answer 503 when the limiter fails, instead of letting the
    /// request through.
    pub fn fail_open(self, fail_open: bool) -> Self {
        self.edit(|s| s.fail_open = fail_open)
    }

    /// Where the outage lines go (default: the limiter's logger, else `log`).
    pub fn logger(self, logger: Logger) -> Self {
        self.edit(|s| s.logger = Some(logger))
    }
}

impl<S, C> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimitService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around the inner one.
pub struct RateLimitService<S, C> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C> Clone for RateLimitService<S, C> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

enum Verdict {
    Pass(Option<Decision>),
    Deny(Decision),
    Unavailable,
}

impl<C> Shared<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn judge(&self, parts: &Parts) -> Verdict {
        let Some(id) = (self.key_fn)(parts) else {
            return Verdict::Pass(None);
        };
        let cost = (self.cost_fn)(parts);
        let limits: Vec<Limit> = self
            .policies
            .iter()
            .map(|p| {
                Limit::new(
                    format!("{}{{{id}}}:{}", self.prefix, p.name),
                    p.capacity,
                    p.rate,
                )
                .cost(cost)
                .name(p.name.clone())
            })
            .collect();
        let result = match limits.as_slice() {
            [one] => self
                .limiter
                .take(&one.key, one.capacity, one.rate, one.n)
                .await
                .map(|d| d.with_policy_name(one.name.clone().unwrap_or_default())),
            _ => self.limiter.take_all(&limits).await,
        };
        match result {
            Ok(decision) => {
                if self.outage.failing.swap(false, Ordering::SeqCst) {
                    emit(
                        &self.logger,
                        log::Level::Info,
                        "redis-tb: rate limiter available again",
                    );
                }
                if decision.allowed {
                    Verdict::Pass(Some(decision))
                } else {
                    Verdict::Deny(decision)
                }
            }
            Err(e) => {
                self.failed(&e);
                Verdict::Unavailable
            }
        }
    }

    fn failed(&self, e: &Error) {
        if !self.outage.failing.swap(true, Ordering::SeqCst) {
            let action = if self.fail_open {
                "letting requests through"
            } else {
                "answering 503"
            };
            emit(
                &self.logger,
                log::Level::Warn,
                &format!("redis-tb: rate limiter unavailable, {action}: {e}"),
            );
        }
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The 429 body for a denial (RFC 9457 problem details, quota-exceeded).
pub fn problem_body(decision: &Decision) -> String {
    let name = decision
        .policy()
        .map(|p| p.name.as_str())
        .unwrap_or("default");
    let detail = match decision.retry_after_secs() {
        Some(secs) => format!(
            "Rate limit of policy {} exceeded; retry in {secs} s.",
            sf_string(name)
        ),
        None => format!(
            "This request costs more than policy {} can ever allow.",
            sf_string(name)
        ),
    };
    format!(
        "{{\"type\": {}, \"title\": \"Too Many Requests\", \"status\": 429, \"detail\": {}, \"violated-policies\": [{}]}}",
        json_string(QUOTA_EXCEEDED),
        json_string(&detail),
        json_string(name)
    )
}

fn problem_response<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, C, B, ResBody> Service<Request<B>> for RateLimitService<S, C>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: Send + 'static,
    ResBody: From<String> + Send + 'static,
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was polled ready serves this request; the clone
        // stays for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let verdict = shared.judge(&parts).await;
            let request = Request::from_parts(parts, body);
            match verdict {
                Verdict::Pass(decision) => {
                    let mut response = inner.call(request).await?;
                    if let Some(decision) = decision {
                        response.headers_mut().extend(decision.header_map());
                    }
                    Ok(response)
                }
                Verdict::Deny(decision) => {
                    let mut response = problem_response(StatusCode::TOO_MANY_REQUESTS, problem_body(&decision));
                    response.headers_mut().extend(decision.header_map());
                    Ok(response)
                }
                Verdict::Unavailable if shared.fail_open => inner.call(request).await,
                Verdict::Unavailable => Ok(problem_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "{\"title\": \"Service Unavailable\", \"status\": 503, \"detail\": \"The rate limiter is unavailable.\"}".to_string(),
                )),
            }
        })
    }
}

//! A `tower::Layer` (feature `tower`) that rate-limits HTTP requests: usable
//! with axum (`Router::layer`), hyper and any tower stack over `http` 1.

use crate::aio::AsyncRateLimiter;
use crate::backend::{emit, Logger};
use crate::core::{bucket_key, check_policy};
use crate::decision::{sf_string, Decision, Limit, Policy};
use crate::error::{Error, Result};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// The caller's identity from the request: `None` lets the request through
/// unlimited (e.g. health checks).
pub type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
/// The request's cost in tokens (default 1).
pub type CostFn = Arc<dyn Fn(&Parts) -> f64 + Send + Sync>;
/// The response to a limiter error that is a bug, not an outage (see
/// [`RateLimitLayer::on_error`]); the default answers 500.
pub type ErrorHandler = Arc<dyn Fn(&Error) -> Response<String> + Send + Sync>;

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

/// The outage of one layer: whether calls are failing now, and how many
/// have failed (shared by the layer's clones).
#[derive(Default)]
struct Outage {
    failing: AtomicBool,
    failed_calls: AtomicU64,
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
    on_error: ErrorHandler,
    outage: Arc<Outage>,
}

/// The rate-limiting layer: one limit ([`RateLimitLayer::new`]) or several
/// at once ([`RateLimitLayer::all`], TB.TAKEALL: all or nothing).
///
/// The bucket of policy `name` for caller `id` is `<prefix>{<escaped id>}:<name>`
/// (prefix default `"ratelimit:"`, see [`bucket_key`]): one hash tag per
/// caller that no id can break, so all its buckets share a cluster slot.
/// The caller id comes from the key function (default: the client IP, see
/// [`client_ip`]; a request without one is not limited).
///
/// On allow the request goes through and the response gets the
/// `RateLimit-Policy` / `RateLimit` headers; on deny the answer is 429
/// `application/problem+json` with the headers and `Retry-After`.
/// Failures follow the one failure rule (docs/clients.md): when the limiter
/// is unavailable (Redis down, hung, loading) the request goes through
/// without headers (fail open, the default) or gets a 503 (fail closed),
/// one warning is logged when failures start and one info line when calls
/// succeed again, and each failed call is counted
/// ([`unavailable_count`](Self::unavailable_count)); any other error is a
/// bug (a wrong key type, a bad cost, CROSSSLOT) and is never let through:
/// it is logged at error level and answered 500 (or by [`on_error`](Self::on_error)).
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
    /// name `"default"` (for another name, [`all`](Self::all) with one
    /// policy). [`Error::InvalidArgument`] if the limit is not valid.
    pub fn new(
        limiter: AsyncRateLimiter<C>,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
    ) -> Result<Self> {
        Self::all(limiter, vec![Policy::new("default", capacity, rate)])
    }

    /// Several limits at once (TB.TAKEALL, all or nothing); each [`Policy`]
    /// names its bucket and headers. [`Error::InvalidArgument`] if there is
    /// none, or one is not valid, or two share a name.
    pub fn all(limiter: AsyncRateLimiter<C>, policies: Vec<Policy>) -> Result<Self> {
        if policies.is_empty() {
            return Err(Error::InvalidArgument(
                "a layer needs at least one policy".into(),
            ));
        }
        for (i, policy) in policies.iter().enumerate() {
            check_policy(policy)?;
            if policies.iter().take(i).any(|p| p.name == policy.name) {
                return Err(Error::InvalidArgument(format!(
                    "two policies are named {:?}",
                    policy.name
                )));
            }
        }
        let logger = limiter.logger().clone();
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                policies,
                key_fn: Arc::new(default_key),
                cost_fn: Arc::new(|_| 1.0),
                prefix: "ratelimit:".into(),
                fail_open: true,
                logger,
                on_error: Arc::new(internal_error),
                outage: Arc::new(Outage::default()),
            }),
        })
    }

    /// Calls the limiter could not make because it was unavailable, so far.
    pub fn unavailable_count(&self) -> u64 {
        self.shared.outage.failed_calls.load(Ordering::SeqCst)
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

    /// The bucket key prefix (default `"ratelimit:"`).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.edit(|s| s.prefix = prefix)
    }

    /// `false`: answer 503 when the limiter is unavailable, instead of
    /// letting the request through.
    pub fn fail_open(self, fail_open: bool) -> Self {
        self.edit(|s| s.fail_open = fail_open)
    }

    /// Where the outage lines go (default: the limiter's logger, else `log`).
    pub fn logger(self, logger: Logger) -> Self {
        self.edit(|s| s.logger = Some(logger))
    }

    /// The response to an error that is a bug, not an outage (the error is
    /// logged first either way). Default: 500 with a problem+json body.
    pub fn on_error(
        self,
        handler: impl Fn(&Error) -> Response<String> + Send + Sync + 'static,
    ) -> Self {
        self.edit(|s| s.on_error = Arc::new(handler))
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
    Bug(Error),
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
                Limit::new(bucket_key(&self.prefix, &id, &p.name), p.capacity, p.rate)
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
            Err(e) if e.is_unavailable() => {
                self.unavailable(&e);
                Verdict::Unavailable
            }
            Err(e) => {
                emit(
                    &self.logger,
                    log::Level::Error,
                    &format!("redis-tb: rate limiter error (a bug, not an outage): {e}"),
                );
                Verdict::Bug(e)
            }
        }
    }

    fn unavailable(&self, e: &Error) {
        self.outage.failed_calls.fetch_add(1, Ordering::SeqCst);
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
    let name = decision.policy.as_str();
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

/// The default answer to a bug: 500, problem+json.
fn internal_error(_: &Error) -> Response<String> {
    problem_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "{\"title\": \"Internal Server Error\", \"status\": 500, \"detail\": \"The rate limiter failed.\"}".to_string(),
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
    type Future = BoxFuture<std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
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
                Verdict::Bug(e) => Ok((shared.on_error)(&e).map(ResBody::from)),
                Verdict::Unavailable => Ok(problem_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "{\"title\": \"Service Unavailable\", \"status\": 503, \"detail\": \"The rate limiter is unavailable.\"}".to_string(),
                )),
            }
        })
    }
}

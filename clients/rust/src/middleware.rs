//! A `tower::Layer` (feature `tower`) that rate-limits HTTP requests: usable
//! with axum (`Router::layer`), hyper and any tower stack over `http` 1.

use crate::aio::{AsyncLeaseGuard, AsyncRateLimiter};
use crate::backend::{emit, Logger};
use crate::decision::{bucket_key, check_policy, sf_string, Decision, Limit, Policy, Source};
use crate::error::{Error, Result};
use crate::lease::{LeaseDecision, Permit};
use crate::local::OnUnavailable;
use crate::metrics::{LeaseOutcome, Origin};
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
/// unlimited (e.g. health checks; callers without an id of their own belong
/// in a shared bucket such as `"anon"`, not here).
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

/// The default caller id (docs/clients.md#the-same-behaviour-in-all-three):
/// the peer address `remote` as the server gives it, an IPv4-mapped IPv6
/// address (`::ffff:127.0.0.1`) written as the IPv4 address, `"unknown"`
/// when there is none. So the same client gets one bucket whichever
/// language serves it.
pub fn default_id(remote: Option<&str>) -> String {
    let Some(remote) = remote else {
        return "unknown".into();
    };
    match remote.parse::<IpAddr>() {
        Ok(ip) => ip.to_canonical().to_string(),
        Err(_) => remote.to_string(),
    }
}

/// What a layer does when the limiter is unavailable (docs/clients.md#when-redis-is-down-the-local-limiter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LayerOnUnavailable {
    /// The request goes through unlimited, without headers (the default).
    #[default]
    Open,
    /// 503.
    Closed,
    /// The limiter's local limiter decides (429 as usual); what it does not
    /// serve (the in-flight limit's leases) goes through as with `Open`.
    Local,
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

/// The outage log of one layer: one warning when calls start failing, one
/// info line when they work again, and how many have failed (shared by the
/// layer's clones). `OutageLog` in all three libraries.
#[derive(Default)]
struct OutageLog {
    failing: AtomicBool,
    failed_calls: AtomicU64,
}

impl OutageLog {
    /// A call reached the limiter: one info line if an outage ends.
    fn succeeded(&self, logger: &Option<Logger>) {
        if self.failing.swap(false, Ordering::SeqCst) {
            emit(
                logger,
                log::Level::Info,
                "redis-tb: rate limiter available again",
            );
        }
    }

    /// A call found the limiter unavailable: counted, and one warning when
    /// an outage starts.
    fn failed(&self, logger: &Option<Logger>, passes: bool, e: &Error) {
        self.failed_calls.fetch_add(1, Ordering::SeqCst);
        if !self.failing.swap(true, Ordering::SeqCst) {
            let action = if passes {
                "letting requests through"
            } else {
                "answering 503"
            };
            emit(
                logger,
                log::Level::Warn,
                &format!("redis-tb: rate limiter unavailable, {action}: {e}"),
            );
        }
    }
}

/// `tb.source` of a request the limiter could not judge: let through, or 503.
fn unavailable_origin(passes: bool) -> Origin {
    if passes {
        Origin::UnavailableAllowed
    } else {
        Origin::UnavailableDenied
    }
}

/// A bug, not an outage: logged at error level, every time.
fn log_bug(logger: &Option<Logger>, e: &Error) {
    emit(
        logger,
        log::Level::Error,
        &format!("redis-tb: rate limiter error (a bug, not an outage): {e}"),
    );
}

/// What a layer does with a request: `P` is what an allowed response's
/// headers come from, `D` the denial.
enum Verdict<P, D> {
    /// Through: with `P`, or without (no caller id, or failed open).
    Pass(Option<P>),
    Deny(D),
    Unavailable,
    Bug(Error),
}

/// What the rate and the in-flight layer share: who the caller is, where
/// the keys go, and what the failure rule does with an error.
#[derive(Clone)]
struct Middleware {
    key_fn: KeyFn,
    prefix: String,
    on_unavailable: LayerOnUnavailable,
    logger: Option<Logger>,
    on_error: ErrorHandler,
    /// Per layer: a layer made from another's settings gets its own.
    outage_log: Arc<OutageLog>,
}

impl Middleware {
    fn new(logger: Option<Logger>) -> Middleware {
        Middleware {
            key_fn: Arc::new(default_key),
            prefix: "ratelimit:".into(),
            on_unavailable: LayerOnUnavailable::Open,
            logger,
            on_error: Arc::new(internal_error),
            outage_log: Arc::new(OutageLog::default()),
        }
    }

    /// The same settings, with an outage log (and its count) of its own.
    fn fresh(&self) -> Middleware {
        Middleware {
            outage_log: Arc::new(OutageLog::default()),
            ..self.clone()
        }
    }

    fn unavailable_count(&self) -> u64 {
        self.outage_log.failed_calls.load(Ordering::SeqCst)
    }

    /// An unavailable limiter lets the request through (`Open`, and
    /// `Local` for what the local limiter does not serve).
    fn passes(&self) -> bool {
        self.on_unavailable != LayerOnUnavailable::Closed
    }

    /// `result` under the failure rule: a success from Redis ends an
    /// outage (a local answer does not: the limiter logs its own outage),
    /// and is the caller's to judge; an outage is counted (and warned of
    /// once); a bug is logged every time.
    fn settle<T: Served, P, D>(&self, result: Result<T>) -> std::result::Result<T, Verdict<P, D>> {
        match result {
            Ok(value) => {
                if !value.served_locally() {
                    self.outage_log.succeeded(&self.logger);
                }
                Ok(value)
            }
            Err(e) if e.is_unavailable() => {
                self.outage_log.failed(&self.logger, self.passes(), &e);
                Err(Verdict::Unavailable)
            }
            Err(e) => {
                log_bug(&self.logger, &e);
                Err(Verdict::Bug(e))
            }
        }
    }

    /// The answer to a bug, in either layer's body type.
    fn bug_response<B: From<String>>(&self, e: &Error) -> Response<B> {
        (self.on_error)(e).map(B::from)
    }
}

/// An answer a layer judges, and whether the local limiter gave it.
trait Served {
    fn served_locally(&self) -> bool;
}

impl Served for Decision {
    fn served_locally(&self) -> bool {
        self.source() == Source::Local
    }
}

impl<G> Served for Permit<G> {
    fn served_locally(&self) -> bool {
        false
    }
}

/// The settings both layers take the same way, on their `middleware` part
/// (the layer's `shared` state, changed through its `edit`): one text, so
/// that the two layers' settings and docs cannot drift apart.
macro_rules! common_settings {
    () => {
        /// Calls the limiter could not make because it was unavailable, so far.
        pub fn unavailable_count(&self) -> u64 {
            self.shared.middleware.unavailable_count()
        }

        /// The caller's identity (default: the client IP as [`default_id`]
        /// writes it, `"unknown"` without one); `None` lets the request
        /// through unlimited (e.g. a health check). Per user, callers
        /// without the header sharing one `"anon"` bucket:
        /// `|p| Some(p.headers.get("x-user").and_then(|v| v.to_str().ok()).unwrap_or("anon").to_string())`;
        /// per route and IP: `|p| client_ip(p).map(|ip| format!("{ip}:{}", p.uri.path()))`.
        pub fn key_fn(self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
            self.edit(|s| s.middleware.key_fn = Arc::new(f))
        }

        /// The key prefix (default `"ratelimit:"`): the keys are
        /// `<prefix>{<escaped id>}:<name>`.
        pub fn prefix(self, prefix: impl Into<String>) -> Self {
            let prefix = prefix.into();
            self.edit(|s| s.middleware.prefix = prefix)
        }

        /// `false` (fail closed): answer 503 when the limiter is unavailable.
        /// `true` (the default, fail open): let the request through
        /// unlimited: without rate-limit headers, and in the in-flight layer
        /// without a lease. The older spelling of
        /// [`on_unavailable`](Self::on_unavailable)`(Open | Closed)`.
        pub fn fail_open(self, fail_open: bool) -> Self {
            self.on_unavailable(if fail_open {
                LayerOnUnavailable::Open
            } else {
                LayerOnUnavailable::Closed
            })
        }

        /// What an unavailable limiter does to a request:
        /// [`LayerOnUnavailable::Open`] (the default: through, unlimited),
        /// [`Closed`](LayerOnUnavailable::Closed) (503) or
        /// [`Local`](LayerOnUnavailable::Local): the limiter's local limiter
        /// decides (its `instances`, `local_max_keys` and `local_probe_ms`;
        /// the in-flight limit, not served locally, goes through as `Open`).
        pub fn on_unavailable(self, mode: LayerOnUnavailable) -> Self {
            self.edit(|s| {
                s.middleware.on_unavailable = mode;
                if mode == LayerOnUnavailable::Local {
                    // This layer's own copy of the limiter's settings; the
                    // local buckets stay the limiter's.
                    s.limiter = s.limiter.clone().on_unavailable(OnUnavailable::Local);
                }
            })
        }

        /// Where the outage lines go (default: the limiter's logger, else `log`).
        pub fn logger(self, logger: Logger) -> Self {
            self.edit(|s| s.middleware.logger = Some(logger))
        }

        /// The response to an error that is a bug, not an outage (the error is
        /// logged first either way). Default: 500 with a problem+json body.
        pub fn on_error(
            self,
            handler: impl Fn(&Error) -> Response<String> + Send + Sync + 'static,
        ) -> Self {
            self.edit(|s| s.middleware.on_error = Arc::new(handler))
        }
    };
}

/// A layer's `Clone` and `Layer` impls, and the service it wraps around
/// the inner one, whose request path is the same for both layers: the
/// layer's `judge` gives the verdict; a pass runs the inner service while
/// it holds what `judge` passed (a dropped future drops it), and the
/// layer's `through` adds what an allowed response carries; a denial is the
/// layer's `denied`; an outage and a bug follow the failure rule.
/// `body` is the service's response body type, around the inner one's
/// (`ResBody`).
macro_rules! layer_service {
    (layer $layer:ident, service $service:ident, state $shared:ident, body $body:ty) => {
        impl<C> Clone for $layer<C> {
            fn clone(&self) -> Self {
                $layer {
                    shared: self.shared.clone(),
                }
            }
        }

        impl<S, C> Layer<S> for $layer<C> {
            type Service = $service<S, C>;

            fn layer(&self, inner: S) -> Self::Service {
                $service {
                    inner,
                    shared: self.shared.clone(),
                }
            }
        }

        #[doc = concat!("The service [`", stringify!($layer), "`] wraps around the inner one.")]
        pub struct $service<S, C> {
            inner: S,
            shared: Arc<$shared<C>>,
        }

        impl<S: Clone, C> Clone for $service<S, C> {
            fn clone(&self) -> Self {
                $service {
                    inner: self.inner.clone(),
                    shared: self.shared.clone(),
                }
            }
        }

        impl<S, C, B, ResBody> Service<Request<B>> for $service<S, C>
        where
            S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
            S::Future: Send,
            S::Error: Send,
            B: Send + 'static,
            ResBody: From<String> + Send + 'static,
            C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
        {
            type Response = Response<$body>;
            type Error = S::Error;
            type Future = BoxFuture<std::result::Result<Self::Response, Self::Error>>;

            fn poll_ready(
                &mut self,
                cx: &mut Context<'_>,
            ) -> Poll<std::result::Result<(), Self::Error>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, request: Request<B>) -> Self::Future {
                let mut inner = take_ready(&mut self.inner);
                let shared = self.shared.clone();
                Box::pin(async move {
                    let (parts, body) = request.into_parts();
                    let verdict = shared.judge(&parts).await;
                    let request = Request::from_parts(parts, body);
                    let passed = match verdict {
                        Verdict::Pass(passed) => passed,
                        Verdict::Deny(denial) => return Ok(shared.denied(denial)),
                        Verdict::Unavailable if shared.middleware.passes() => None,
                        Verdict::Unavailable => return Ok(unavailable_response()),
                        Verdict::Bug(e) => return Ok(shared.middleware.bug_response(&e)),
                    };
                    // Held across the inner call: a dropped future drops it.
                    let response = inner.call(request).await?;
                    Ok(shared.through(passed, response).await)
                })
            }
        }
    };
}

#[derive(Clone)]
struct Shared<C> {
    limiter: AsyncRateLimiter<C>,
    policies: Vec<Policy>,
    cost_fn: CostFn,
    middleware: Middleware,
}

/// The rate-limiting layer: one limit ([`RateLimitLayer::new`]) or several
/// at once ([`RateLimitLayer::all`], TB.TAKEALL: all or nothing).
///
/// The bucket of policy `name` for caller `id` is `<prefix>{<escaped id>}:<name>`
/// (prefix default `"ratelimit:"`, see [`bucket_key`]): one hash tag per
/// caller that no id can break, so all its buckets share a cluster slot.
/// The caller id comes from the key function (default: the client IP as
/// [`default_id`] writes it, `"unknown"` for a request without one).
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

fn default_key(parts: &Parts) -> Option<String> {
    Some(match client_ip(parts) {
        Some(ip) => ip.to_canonical().to_string(),
        None => default_id(None),
    })
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
        let middleware = Middleware::new(limiter.logger().clone());
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                policies,
                cost_fn: Arc::new(|_| 1.0),
                middleware,
            }),
        })
    }

    common_settings!();

    fn edit(mut self, f: impl FnOnce(&mut Shared<C>)) -> Self {
        // A layer cloned before this call keeps its own settings.
        f(Arc::make_mut(&mut self.shared));
        self
    }

    /// The request's cost in tokens (default 1), taken from every limit.
    pub fn cost_fn(self, f: impl Fn(&Parts) -> f64 + Send + Sync + 'static) -> Self {
        self.edit(|s| s.cost_fn = Arc::new(f))
    }
}

/// The default policy name of a [`ConcurrencyLimitLayer`], and so the last
/// part of its lease set keys: `<prefix>{<escaped id>}:inflight`.
pub const INFLIGHT: &str = "inflight";

/// The default `lease_ms` of an in-flight limit: 60 s, as in the Python and
/// Node libraries.
pub const LEASE_MS_DEFAULT: u64 = 60_000;

impl<C> RateLimitLayer<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// An in-flight limit beside this layer, named [`INFLIGHT`]: see
    /// [`concurrency_named`](Self::concurrency_named).
    pub fn concurrency(&self, limit: u64, lease_ms: u64) -> Result<ConcurrencyLimitLayer<C>> {
        self.concurrency_named(INFLIGHT, limit, lease_ms)
    }

    /// [`concurrency`](Self::concurrency) with the default `lease_ms`,
    /// [`LEASE_MS_DEFAULT`] (60 s).
    pub fn in_flight(&self, limit: u64) -> Result<ConcurrencyLimitLayer<C>> {
        self.concurrency(limit, LEASE_MS_DEFAULT)
    }

    /// An in-flight limit (at most `limit` requests of one caller at once)
    /// to stack beside this layer: its lease set is
    /// `<prefix>{<escaped id>}:<name>`, with this layer's limiter, caller id
    /// ([`key_fn`](Self::key_fn)), prefix, `fail_open`, logger and
    /// `on_error` as they are now (configure this layer first), so it shares
    /// the caller's cluster slot. [`Error::InvalidArgument`] when `name` is
    /// one of this layer's policy names (a bucket is a hash, a lease set a
    /// sorted set: the same key cannot be both), or as
    /// [`ConcurrencyLimitLayer::named`].
    pub fn concurrency_named(
        &self,
        name: impl Into<String>,
        limit: u64,
        lease_ms: u64,
    ) -> Result<ConcurrencyLimitLayer<C>> {
        let name = name.into();
        if self.shared.policies.iter().any(|p| p.name == name) {
            return Err(Error::InvalidArgument(format!(
                "the in-flight limit's name {name:?} is a rate policy's name: its lease set \
                 would be that policy's bucket"
            )));
        }
        let s = &self.shared;
        let layer = ConcurrencyLimitLayer::named(s.limiter.clone(), name, limit, lease_ms)?;
        Ok(layer.edit(|c| c.middleware = s.middleware.fresh()))
    }
}

layer_service!(layer RateLimitLayer, service RateLimitService, state Shared, body ResBody);

impl<C> Shared<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn judge(&self, parts: &Parts) -> Verdict<(Decision, Vec<Limit>), Decision> {
        let Some(id) = (self.middleware.key_fn)(parts) else {
            return Verdict::Pass(None);
        };
        let started = std::time::Instant::now();
        let cost = (self.cost_fn)(parts);
        let limits: Vec<Limit> = self
            .policies
            .iter()
            .map(|p| {
                let key = bucket_key(&self.middleware.prefix, &id, &p.name);
                Limit::new(key, p.capacity, p.rate)
                    .cost(cost)
                    .name(p.name.clone())
            })
            .collect();
        // The limiter records the decisions it answers (under the
        // policy's name: `take_limit` takes the Limit's); an outage is the
        // layer's to record, as what it did with the request.
        let result = match limits.as_slice() {
            [one] => self.limiter.take_limit(one, 0).await,
            _ => self.limiter.take_all(&limits).await,
        };
        match self.middleware.settle(result) {
            Ok(decision) if decision.allowed => Verdict::Pass(Some((decision, limits))),
            Ok(decision) => Verdict::Deny(decision),
            Err(Verdict::Unavailable) => {
                // No limit decided: the layer's first policy names it.
                let name = self.policies.first().map_or("default", |p| p.name.as_str());
                let passes = self.middleware.passes();
                let origin = unavailable_origin(passes);
                let metrics = self.limiter.metrics();
                metrics.decision(name, passes, origin, started);
                Verdict::Unavailable
            }
            Err(verdict) => verdict,
        }
    }

    /// 429 with the problem document and the headers.
    fn denied<B: From<String>>(&self, decision: Decision) -> Response<B> {
        let mut response = problem_response(StatusCode::TOO_MANY_REQUESTS, problem_body(&decision));
        response.headers_mut().extend(decision.header_map());
        response
    }

    /// An allowed response gets the decision's headers (none without one).
    /// A request that an in-flight layer inside this one refused did not
    /// run: its tokens are refunded, so that a request refused for
    /// concurrency spends none whichever layer is outside
    /// (docs/clients.md#the-same-behaviour-in-all-three), and its 429 is
    /// the in-flight layer's alone.
    async fn through<B>(
        &self,
        passed: Option<(Decision, Vec<Limit>)>,
        mut response: Response<B>,
    ) -> Response<B> {
        let Some((decision, limits)) = passed else {
            return response;
        };
        if response.extensions().get::<RefusedInFlight>().is_some() {
            self.refund(&limits).await;
            return response;
        }
        add_headers(&mut response, decision.header_map(), Place::First);
        response
    }

    /// Gives back the tokens of `limits`, one refund each. Best effort: an
    /// unavailable limiter keeps them (the caller is limited a little
    /// early, never let past its limit); a bug is logged.
    async fn refund(&self, limits: &[Limit]) {
        for limit in limits.iter().filter(|l| l.n > 0.0) {
            let refunded = self
                .limiter
                .refund(&limit.key, limit.capacity, limit.rate, limit.n)
                .await;
            match refunded {
                Err(e) if !e.is_unavailable() => log_bug(&self.middleware.logger, &e),
                _ => {}
            }
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

/// Where a layer's `RateLimit-Policy` items go in the response's line.
#[derive(Clone, Copy)]
enum Place {
    /// The rate policies: first.
    First,
    /// The in-flight policy: last.
    Last,
}

/// Adds `headers` to the response's own (an inner layer's stay).
/// `RateLimit-Policy` stays ONE line, the rate policies before the
/// in-flight one, whichever of the two layers is outside.
fn add_headers<B>(response: &mut Response<B>, headers: http::HeaderMap, place: Place) {
    for (name, value) in &headers {
        let merged = (name == http::header::HeaderName::from_static("ratelimit-policy"))
            .then(|| response.headers().get(name))
            .flatten()
            .and_then(|existing| {
                let (existing, mine) = (existing.to_str().ok()?, value.to_str().ok()?);
                let line = match place {
                    Place::First => format!("{mine}, {existing}"),
                    Place::Last => format!("{existing}, {mine}"),
                };
                HeaderValue::from_str(&line).ok()
            });
        match merged {
            Some(line) => {
                response.headers_mut().insert(name.clone(), line);
            }
            None => {
                response.headers_mut().append(name.clone(), value.clone());
            }
        }
    }
}

fn unavailable_response<B: From<String>>() -> Response<B> {
    problem_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "{\"title\": \"Service Unavailable\", \"status\": 503, \"detail\": \"The rate limiter is unavailable.\"}".to_string(),
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

/// The service that was polled ready, to serve this request; its clone
/// stays in its place for the next one.
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// The in-flight limit: at most `limit` requests of one caller at once
/// (TB.ACQUIRE / TB.RELEASE, docs/leases.md).
///
/// Each request takes a lease on `<prefix>{<escaped id>}:<name>` (the same
/// keys as [`RateLimitLayer`]: see [`bucket_key`]) when it starts, and gives
/// it back when its response body has been sent in full, or when the
/// request's future or body is dropped (the client went away, the handler
/// panicked, a timeout layer gave up): the release then runs in a spawned
/// task. While the request runs the lease is renewed every `lease_ms / 3`,
/// so `lease_ms` bounds how long a crashed process holds a slot, not how
/// long a request may take.
///
/// A request that finds `limit` in flight gets 429 (or [`deny_status`](Self::deny_status),
/// e.g. 503) with `application/problem+json`, `RateLimit-Policy:
/// "<name>";q=<limit>;qu="concurrent-requests"` and `Retry-After`
/// (`ceil(retry_after_ms / 1000)`, at least 1: the seconds until the
/// earliest lease ends by itself, though a release usually frees a slot
/// sooner). Allowed responses get `RateLimit-Policy`, appended to any
/// headers the inner service set.
/// Failures follow the one failure rule as in [`RateLimitLayer`]: fail open
/// (the request goes through without a lease; the default) or closed (503),
/// and never open on a bug (500, or [`on_error`](Self::on_error)).
///
/// The response body is wrapped in a [`LeaseBody`], which is what lets the
/// lease last exactly as long as the body.
pub struct ConcurrencyLimitLayer<C> {
    shared: Arc<InFlight<C>>,
}

#[derive(Clone)]
struct InFlight<C> {
    limiter: AsyncRateLimiter<C>,
    name: String,
    limit: u64,
    lease_ms: u64,
    deny_status: StatusCode,
    middleware: Middleware,
}

impl<C> ConcurrencyLimitLayer<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// At most `limit` requests in flight per caller, policy name
    /// [`INFLIGHT`] (its key `<prefix>{<escaped id>}:inflight` and its
    /// headers), each lease lasting `lease_ms` unless renewed.
    /// [`Error::InvalidArgument`] for a `limit` or `lease_ms` of 0 or above
    /// 2^53. Beside a [`RateLimitLayer`], make it with
    /// [`RateLimitLayer::concurrency`] instead: that one shares the rate
    /// layer's caller id, prefix and failure settings, and refuses a name
    /// that is one of its policies'.
    pub fn new(limiter: AsyncRateLimiter<C>, limit: u64, lease_ms: u64) -> Result<Self> {
        Self::named(limiter, INFLIGHT, limit, lease_ms)
    }

    /// [`new`](Self::new) with the default `lease_ms`, [`LEASE_MS_DEFAULT`] (60 s).
    pub fn with_limit(limiter: AsyncRateLimiter<C>, limit: u64) -> Result<Self> {
        Self::new(limiter, limit, LEASE_MS_DEFAULT)
    }

    /// [`new`](Self::new) with the policy `name` instead of `"inflight"`.
    /// [`Error::InvalidArgument`] also for a name that is not printable ASCII.
    pub fn named(
        limiter: AsyncRateLimiter<C>,
        name: impl Into<String>,
        limit: u64,
        lease_ms: u64,
    ) -> Result<Self> {
        let name = name.into();
        crate::decision::check_name(&name)?;
        crate::lease::check_limit(limit)?;
        crate::lease::check_lease_ms(lease_ms)?;
        let middleware = Middleware::new(limiter.logger().clone());
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(InFlight {
                limiter,
                name,
                limit,
                lease_ms,
                deny_status: StatusCode::TOO_MANY_REQUESTS,
                middleware,
            }),
        })
    }

    common_settings!();

    fn edit(mut self, f: impl FnOnce(&mut InFlight<C>)) -> Self {
        f(Arc::make_mut(&mut self.shared));
        self
    }

    /// The status of a denial: 429 (default) or, e.g., 503.
    pub fn deny_status(self, status: StatusCode) -> Self {
        self.edit(|s| s.deny_status = status)
    }
}

layer_service!(
    layer ConcurrencyLimitLayer,
    service ConcurrencyLimitService,
    state InFlight,
    body LeaseBody<ResBody>
);

/// The response extension of an in-flight denial: a rate layer outside
/// the in-flight one refunds the tokens it took for that request.
#[derive(Clone, Copy, Debug)]
struct RefusedInFlight;

/// Through with the lease and its decision, or denied.
type Admission = Verdict<(AsyncLeaseGuard, LeaseDecision), LeaseDecision>;

impl<C> InFlight<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn judge(&self, parts: &Parts) -> Admission {
        let Some(id) = (self.middleware.key_fn)(parts) else {
            return Verdict::Pass(None);
        };
        let key = bucket_key(&self.middleware.prefix, &id, &self.name);
        let started = std::time::Instant::now();
        let outcome = self
            .limiter
            .acquire_strict(&key, self.limit, self.lease_ms)
            .await
            .map(|mut d| {
                d.policy = self.name.clone();
                d
            });
        let metrics = self.limiter.metrics();
        metrics.leased(&self.name, &outcome, false, false);
        let permit = self.limiter.guard_with(outcome, started, false);
        match self.middleware.settle(permit) {
            Ok(Permit::Held(guard)) => {
                let decision = guard.decision().clone();
                Verdict::Pass(Some((guard, decision)))
            }
            Ok(Permit::Denied(decision)) => Verdict::Deny(decision),
            Ok(Permit::FailedOpen(e)) => Verdict::Bug(e),
            Err(Verdict::Unavailable) => {
                let passes = self.middleware.passes();
                let outcome = if passes {
                    LeaseOutcome::Acquired
                } else {
                    LeaseOutcome::Denied
                };
                metrics.lease(&self.name, outcome, unavailable_origin(passes));
                Verdict::Unavailable
            }
            Err(verdict) => verdict,
        }
    }

    /// `deny_status` with the problem document and the headers, marked as
    /// an in-flight refusal for a rate layer outside this one.
    fn denied<B: From<String>>(&self, decision: LeaseDecision) -> Response<B> {
        let body = lease_problem_body(&decision, self.deny_status);
        let mut response = problem_response(self.deny_status, body);
        response.headers_mut().extend(decision.header_map());
        response.extensions_mut().insert(RefusedInFlight);
        response
    }

    /// The body holds the lease until it is sent (none without one), and
    /// the response gets the decision's headers.
    async fn through<B>(
        &self,
        held: Option<(AsyncLeaseGuard, LeaseDecision)>,
        response: Response<B>,
    ) -> Response<LeaseBody<B>> {
        let (guard, decision) = held.unzip();
        let mut response = response.map(|b| LeaseBody::new(b, guard));
        if let Some(decision) = decision {
            add_headers(&mut response, decision.header_map(), Place::Last);
        }
        response
    }
}

/// The problem document of an in-flight denial (RFC 9457, quota-exceeded),
/// with `status` (429 unless configured).
pub fn lease_problem_body(decision: &LeaseDecision, status: StatusCode) -> String {
    let name = sf_string(&decision.policy);
    let detail = format!(
        "Concurrency limit of policy {name} reached ({} in flight); retry in {} s.",
        decision.limit,
        decision.retry_after_secs().unwrap_or(0)
    );
    format!(
        "{{\"type\": {}, \"title\": {}, \"status\": {}, \"detail\": {}, \"violated-policies\": [{}]}}",
        json_string(QUOTA_EXCEEDED),
        json_string(status.canonical_reason().unwrap_or("Too Many Requests")),
        status.as_u16(),
        json_string(&detail),
        json_string(&decision.policy)
    )
}

/// A response body that holds the request's lease until the body has been
/// sent in full (or is dropped), then releases it.
pub struct LeaseBody<B> {
    inner: Pin<Box<B>>,
    guard: Option<AsyncLeaseGuard>,
}

impl<B> LeaseBody<B> {
    fn new(inner: B, guard: Option<AsyncLeaseGuard>) -> LeaseBody<B> {
        LeaseBody {
            inner: Box::pin(inner),
            guard,
        }
    }

    /// The lease this body holds, until the body is done.
    pub fn lease(&self) -> Option<&AsyncLeaseGuard> {
        self.guard.as_ref()
    }
}

impl<B: From<String>> From<String> for LeaseBody<B> {
    fn from(s: String) -> Self {
        LeaseBody::new(B::from(s), None)
    }
}

impl<B> std::fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBody")
            .field("lease", &self.guard)
            .finish()
    }
}

impl<B: http_body::Body> http_body::Body for LeaseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = this.inner.as_mut().poll_frame(cx);
        let done = matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_))))
            || this.inner.is_end_stream();
        if done {
            // Dropping the guard releases the lease (in a spawned task).
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// clients/conformance/behaviour.json (docs/clients.md#the-same-behaviour-in-all-three),
/// every entry, without a server.
#[cfg(test)]
mod behaviour {
    use super::*;
    use crate::decision::Fields;
    use serde_json::Value;

    fn table() -> Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../conformance/behaviour.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// A number of the table: JSON's, or the text JavaScript and Python parse.
    fn number(v: &Value) -> f64 {
        v.as_f64()
            .unwrap_or_else(|| v.as_str().unwrap().parse().unwrap())
    }

    #[test]
    fn default_keys() {
        for case in table()["default_key"].as_array().unwrap() {
            let remote = case["remote"].as_str();
            assert_eq!(default_id(remote), case["id"].as_str().unwrap(), "{case}");
            // The same through the layers' default key function.
            if let Some(ip) = remote.and_then(|r| r.parse::<IpAddr>().ok()) {
                let (mut parts, ()) = Request::new(()).into_parts();
                parts.extensions.insert(SocketAddr::new(ip, 1));
                assert_eq!(default_key(&parts).as_deref(), case["id"].as_str());
            }
        }
        let (parts, ()) = Request::new(()).into_parts();
        assert_eq!(default_key(&parts).as_deref(), Some("unknown"));
    }

    #[test]
    fn one_policy_header_line_rate_first() {
        for case in table()["policy_header"].as_array().unwrap() {
            let policies: Vec<Policy> = case["policies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    let name = p["name"].as_str().unwrap();
                    Policy::new(name, number(&p["capacity"]), number(&p["rate"]))
                })
                .collect();
            let fields = Fields {
                allowed: true,
                remaining: 0,
                retry_after_ms: 0,
                reset_after_ms: 0,
            };
            let index = (policies.len() > 1).then_some(0);
            let rate = Decision::answered(fields, policies, index, Source::Server).unwrap();
            let in_flight = case.get("concurrency").map(|c| LeaseDecision {
                acquired: true,
                available: 0,
                retry_after_ms: 0,
                lease: Some("1-1-1".into()),
                failed_open: false,
                key: "k".into(),
                policy: c["name"].as_str().unwrap().into(),
                limit: c["limit"].as_u64().unwrap(),
                lease_ms: LEASE_MS_DEFAULT,
            });
            // Either layer outside: the same one line.
            for rate_outside in [true, false] {
                let mut response = Response::new(());
                let add_rate = |r: &mut Response<()>| {
                    add_headers(r, rate.header_map(), Place::First);
                };
                if rate_outside {
                    if let Some(d) = &in_flight {
                        add_headers(&mut response, d.header_map(), Place::Last);
                    }
                    add_rate(&mut response);
                } else {
                    add_rate(&mut response);
                    if let Some(d) = &in_flight {
                        add_headers(&mut response, d.header_map(), Place::Last);
                    }
                }
                let lines: Vec<_> = response
                    .headers()
                    .get_all("ratelimit-policy")
                    .iter()
                    .collect();
                assert_eq!(lines, [case["header"].as_str().unwrap()], "{case}");
            }
        }
    }

    #[test]
    fn limits_are_refused_when_made() {
        for case in table()["invalid_limits"].as_array().unwrap() {
            let key = case["key"].as_str().unwrap();
            let (capacity, rate) = (number(&case["capacity"]), number(&case["rate"]));
            let limit = Limit::new(key, capacity, rate)
                .cost(number(&case["n"]))
                .name(case["name"].as_str().unwrap());
            assert!(
                matches!(limit.check(), Err(Error::InvalidArgument(_))),
                "{case}"
            );
            // And by every call's check, before anything is sent.
            assert!(crate::backend::Call::all(std::slice::from_ref(&limit)).is_err());
        }
        assert!(Limit::try_new("k", 5, 1).is_ok());
        assert!(Limit::try_new("k", 5, 0).is_err());
    }

    #[test]
    fn the_shared_option_names_and_defaults() {
        let table = table();
        let defaults = &table["defaults"];
        let limiter = crate::limiter::Options::default();
        let middleware = Middleware::new(None);
        let names = |v: &Value| v.as_str().unwrap().to_string();
        let mut seen = 0;
        for (name, value) in defaults.as_object().unwrap() {
            match name.as_str() {
                "prefix" => assert_eq!(middleware.prefix, names(value)),
                "lease_ms" => assert_eq!(LEASE_MS_DEFAULT, value.as_u64().unwrap()),
                "concurrency_name" => assert_eq!(INFLIGHT, names(value)),
                "module_recheck_ms" => {
                    assert_eq!(limiter.recheck.as_millis() as u64, value.as_u64().unwrap())
                }
                "on_unavailable_limiter" => {
                    assert_eq!(limiter.local.on_unavailable, OnUnavailable::Raise);
                    assert_eq!(names(value), "raise");
                }
                "on_unavailable_middleware" => {
                    assert_eq!(middleware.on_unavailable, LayerOnUnavailable::Open);
                    assert_eq!(names(value), "open");
                }
                "instances" => {
                    assert_eq!(u64::from(limiter.local.instances), value.as_u64().unwrap())
                }
                "local_max_keys" => {
                    assert_eq!(limiter.local.max_keys as u64, value.as_u64().unwrap())
                }
                "local_probe_ms" => assert_eq!(limiter.local.probe_ms, value.as_u64().unwrap()),
                "cache_denials" => {
                    assert_eq!(limiter.local.cache_denials, value.as_bool().unwrap())
                }
                other => panic!("behaviour.json has a default this test does not know: {other}"),
            }
            seen += 1;
        }
        assert_eq!(seen, 10);
    }
}

//! The limiter's metrics (docs/clients.md#metrics) as the SDK's in-memory
//! exporter sees them, from a meter provider given to the limiter alone:
//! the middleware's outage sources, the in-flight leases, a lost guard, and
//! a crate without the feature `metrics`, which records nothing. The shared
//! cases of clients/conformance/metrics.json run in conformance.rs.

use crate::api::GENEROUS;
use crate::common::*;
use crate::web::{get, get_with, serve, serve_app, x_user};
use axum::Router;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use redis_tb_client::{
    AsyncRateLimiter, ConcurrencyLimitLayer, LayerOnUnavailable, Permit, RateLimitLayer,
    RateLimiter,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// One data point: its instrument, attributes, and a counter's sum or a
/// histogram's count (with the histogram's sum).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub instrument: String,
    pub unit: String,
    pub kind: &'static str,
    pub attributes: BTreeMap<String, String>,
    pub value: u64,
    pub sum: Option<f64>,
}

/// A meter provider whose data points the test reads when it wants: the
/// in-memory exporter behind a reader that only exports when flushed.
pub struct Reader {
    pub provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

impl Reader {
    pub fn new() -> Reader {
        let exporter = InMemoryMetricExporter::default();
        let reader = PeriodicReader::builder(exporter.clone())
            .with_interval(Duration::from_secs(24 * 3600))
            .build();
        let provider = SdkMeterProvider::builder().with_reader(reader).build();
        Reader { provider, exporter }
    }

    /// Every data point recorded so far (cumulative), all from the scope
    /// `redis-tb` at the library's version.
    pub fn collect(&self) -> Vec<Point> {
        self.exporter.reset();
        self.provider.force_flush().unwrap();
        let mut points = Vec::new();
        for batch in self.exporter.get_finished_metrics().unwrap() {
            for scope in batch.scope_metrics() {
                assert_eq!(scope.scope().name(), "redis-tb");
                assert_eq!(scope.scope().version(), Some(redis_tb_client::VERSION));
                for metric in scope.metrics() {
                    let point = |kind,
                                 attributes: &mut dyn Iterator<Item = &opentelemetry::KeyValue>,
                                 value,
                                 sum| Point {
                        instrument: metric.name().to_string(),
                        unit: metric.unit().to_string(),
                        kind,
                        attributes: attributes
                            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                            .collect(),
                        value,
                        sum,
                    };
                    match metric.data() {
                        AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                            assert!(sum.is_monotonic(), "{} is a counter", metric.name());
                            for p in sum.data_points() {
                                points.push(point("counter", &mut p.attributes(), p.value(), None));
                            }
                        }
                        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                            for p in h.data_points() {
                                points.push(point(
                                    "histogram",
                                    &mut p.attributes(),
                                    p.count(),
                                    Some(p.sum()),
                                ));
                            }
                        }
                        other => panic!("{}: unexpected data {other:?}", metric.name()),
                    }
                }
            }
        }
        points
    }

    /// The data points of `instrument`, each as (attributes, value).
    pub fn of(&self, instrument: &str) -> Vec<(BTreeMap<String, String>, u64)> {
        let mut of: Vec<_> = self
            .collect()
            .into_iter()
            .filter(|p| p.instrument == instrument)
            .map(|p| (p.attributes, p.value))
            .collect();
        of.sort();
        of
    }
}

/// Attributes from `tb.` names without their prefix: `attrs(&[("limit", "api"), ...])`.
pub fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("tb.{k}"), v.to_string()))
        .collect()
}

fn decision(limit: &str, outcome: &str, source: &str) -> BTreeMap<String, String> {
    attrs(&[("limit", limit), ("outcome", outcome), ("source", source)])
}

/// A limiter on a loopback port nothing listens on, failing fast.
fn unreachable_limiter(
    reader: &Reader,
) -> AsyncRateLimiter<redis_tb_client::LazyConnectionManager> {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    AsyncRateLimiter::from_client(redis::Client::open(url).unwrap(), GENEROUS)
        .with_meter_provider(&reader.provider)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_layer_records_fail_open_fail_closed_and_local() {
    let reader = Reader::new();
    let limiter = unreachable_limiter(&reader);
    let layer = |mode| {
        RateLimitLayer::new(limiter.clone(), 2, SLOW)
            .unwrap()
            .on_unavailable(mode)
            .logger(Lines::default().logger())
    };
    let open = serve(layer(LayerOnUnavailable::Open)).await;
    let closed = serve(layer(LayerOnUnavailable::Closed)).await;
    let local = serve(layer(LayerOnUnavailable::Local)).await;
    for _ in 0..2 {
        assert_eq!(get(open, "/").await.status, 200);
    }
    assert_eq!(get(closed, "/").await.status, 503);
    // The local limiter's 2 tokens, then its denial.
    assert_eq!(get(local, "/").await.status, 200);
    assert_eq!(get(local, "/").await.status, 200);
    assert_eq!(get(local, "/").await.status, 429);
    assert_eq!(
        reader.of("tb.decisions"),
        [
            (decision("default", "allowed", "local"), 2),
            (decision("default", "allowed", "unavailable_allowed"), 2),
            (decision("default", "denied", "local"), 1),
            (decision("default", "denied", "unavailable_denied"), 1),
        ]
    );
    let durations = reader.of("tb.decision.duration");
    assert_eq!(durations.len(), 4, "{durations:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_layer_records_its_policy_names_from_redis() {
    let server = Server::with_module();
    let reader = Reader::new();
    let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS)
        .with_meter_provider(&reader.provider);
    let one = serve(
        RateLimitLayer::all(
            limiter.clone(),
            vec![redis_tb_client::Policy::new("api", 1, SLOW)],
        )
        .unwrap()
        .key_fn(x_user),
    )
    .await;
    let two = serve(
        RateLimitLayer::all(
            limiter,
            vec![
                redis_tb_client::Policy::new("sec", 5, SLOW),
                redis_tb_client::Policy::new("day", 1, SLOW),
            ],
        )
        .unwrap()
        .key_fn(x_user),
    )
    .await;
    let user = [("x-user", "bob")];
    assert_eq!(get_with(one, "/", &user).await.status, 200);
    assert_eq!(get_with(one, "/", &user).await.status, 429);
    assert_eq!(get_with(two, "/", &user).await.status, 200);
    assert_eq!(get_with(two, "/", &user).await.status, 429);
    assert_eq!(
        reader.of("tb.decisions"),
        [
            (decision("api", "allowed", "redis"), 1),
            (decision("api", "denied", "redis"), 1),
            (decision("day", "allowed", "redis"), 1),
            (decision("day", "denied", "redis"), 1),
        ]
    );
}

/// `/` answers at once, `/slow` waits for its gate (inflight.rs's app), behind `layer`.
fn held_app(
    layer: ConcurrencyLimitLayer<redis_tb_client::LazyConnectionManager>,
) -> (Router, std::sync::Arc<tokio::sync::Notify>) {
    let (routes, gate) = crate::inflight::routes();
    (routes.layer(layer), gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_layer_records_its_leases() {
    let server = Server::with_module();
    let reader = Reader::new();
    let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS)
        .with_meter_provider(&reader.provider);
    let layer = ConcurrencyLimitLayer::new(limiter, 1, 60_000)
        .unwrap()
        .key_fn(x_user);
    let (app, gate) = held_app(layer);
    let addr = serve_app(app).await;
    let user = [("x-user", "carol")];
    let slow = tokio::spawn(async move { get_with(addr, "/slow", &user).await });
    // Until the slow request holds the one slot (the lease set's seq and
    // inc members are not leases).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let members: i64 = redis::cmd("ZCARD")
            .arg("ratelimit:{carol}:inflight")
            .query(&mut server.conn())
            .unwrap();
        if members > 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow request never held its lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get_with(addr, "/", &user).await.status, 429);
    gate.notify_one();
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(
        reader.of("tb.leases"),
        [
            (decision("inflight", "acquired", "redis"), 1),
            (decision("inflight", "denied", "redis"), 1),
        ]
    );
    assert!(reader.of("tb.decisions").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_layer_records_fail_open_and_fail_closed() {
    let reader = Reader::new();
    let limiter = unreachable_limiter(&reader);
    let layer = |fail_open| {
        ConcurrencyLimitLayer::new(limiter.clone(), 1, 60_000)
            .unwrap()
            .fail_open(fail_open)
            .logger(Lines::default().logger())
    };
    let (open, _) = held_app(layer(true));
    let (closed, _) = held_app(layer(false));
    let (open, closed) = (serve_app(open).await, serve_app(closed).await);
    assert_eq!(get(open, "/").await.status, 200);
    assert_eq!(get(closed, "/").await.status, 503);
    assert_eq!(
        reader.of("tb.leases"),
        [
            (decision("inflight", "acquired", "unavailable_allowed"), 1),
            (decision("inflight", "denied", "unavailable_denied"), 1),
        ]
    );
}

/// Takes `key`'s lease away from its holder, as its expiry would.
fn steal(server: &Server, key: &str) {
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
}

#[test]
fn a_sync_guard_that_loses_its_lease_records_lost() {
    let server = Server::with_module();
    let reader = Reader::new();
    let mut limiter = RateLimiter::from_client(server.client(), GENEROUS)
        .with_policy_name("jobs")
        .with_meter_provider(&reader.provider);
    let Permit::Held(mut guard) = limiter.acquire_guard("mg:sync", 1, 60_000).unwrap() else {
        panic!("no lease");
    };
    steal(&server, "mg:sync");
    assert!(!guard.renew().unwrap());
    assert!(guard.is_lost());
    // Once: a lost lease is not renewed again.
    assert!(!guard.renew().unwrap());
    drop(guard);
    assert_eq!(
        reader.of("tb.leases"),
        [
            (decision("jobs", "acquired", "redis"), 1),
            (decision("jobs", "lost", "redis"), 1),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_guard_that_loses_its_lease_records_lost() {
    let server = Server::with_module();
    let reader = Reader::new();
    let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS)
        .with_policy_name("jobs")
        .with_meter_provider(&reader.provider);
    // Renewed every 1 s; the test waits for the loss however long it takes.
    let Permit::Held(guard) = limiter.acquire_guard("mg:async", 1, 3_000).await.unwrap() else {
        panic!("no lease");
    };
    steal(&server, "mg:async");
    let why = tokio::time::timeout(Duration::from_secs(60), guard.lost())
        .await
        .expect("the renewal found the lease gone");
    assert!(!why.is_empty());
    drop(guard);
    assert_eq!(
        reader.of("tb.leases"),
        [
            (decision("jobs", "acquired", "redis"), 1),
            (decision("jobs", "lost", "redis"), 1),
        ]
    );
}

#[test]
fn waits_and_leases_count_once_at_the_end() {
    let server = Server::with_module();
    let reader = Reader::new();
    let mut limiter = RateLimiter::from_client(server.client(), GENEROUS)
        .with_policy_name("q")
        .with_meter_provider(&reader.provider);
    assert!(
        limiter
            .wait_acquire("mw:l", 1, 60_000, 5_000)
            .unwrap()
            .acquired
    );
    assert!(
        !limiter
            .wait_acquire("mw:l", 1, 60_000, 200)
            .unwrap()
            .acquired
    );
    assert_eq!(
        reader.of("tb.leases"),
        [
            (decision("q", "acquired", "redis"), 1),
            (decision("q", "denied", "redis"), 1),
        ]
    );
    assert_eq!(
        reader.of("tb.waits"),
        [
            (attrs(&[("limit", "q"), ("outcome", "allowed")]), 1),
            (attrs(&[("limit", "q"), ("outcome", "denied")]), 1),
        ]
    );
    // A polling wait (no blocking client): still one decision, however many polls.
    let mut polling = RateLimiter::new(server.conn())
        .with_policy_name("poll")
        .with_meter_provider(&reader.provider);
    assert!(polling.take("mw:t", 1, 5.0, 1).unwrap().allowed);
    assert!(
        polling
            .wait_take("mw:t", 1, 5.0, 1, 30_000)
            .unwrap()
            .allowed
    );
    let decisions = reader.of("tb.decisions");
    assert_eq!(
        decisions,
        [(decision("poll", "allowed", "redis"), 2)],
        "{decisions:?}"
    );
    assert!(reader
        .collect()
        .iter()
        .filter(|p| p.instrument == "tb.decision.duration")
        .all(|p| p.sum.is_some_and(|s| s.is_finite() && s >= 0.0) && p.unit == "s"));
}

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// An application of its own with an OpenTelemetry SDK installed as the
/// global meter provider, and this crate as a path dependency WITHOUT the
/// feature `metrics` (so without the `opentelemetry` API): its limiter
/// works the same and records nothing, while the application's own counter
/// is exported. Built in a target dir of its own under this crate's (kept
/// between runs), offline from this crate's Cargo.lock.
#[test]
fn without_the_feature_the_limiter_works_and_records_nothing() {
    let server = Server::with_module();
    let app = tempfile::tempdir().unwrap();
    std::fs::create_dir(app.path().join("src")).unwrap();
    std::fs::write(
        app.path().join("Cargo.toml"),
        format!(
            r#"[package]
name = "redis-tb-client-no-metrics-check"
version = "0.0.0"
edition = "2021"
publish = false
[workspace]
[dependencies]
redis-tb-client = {{ path = "{}" }}
opentelemetry = {{ version = "0.33", default-features = false, features = ["metrics"] }}
opentelemetry_sdk = {{ version = "0.33", default-features = false, features = ["metrics", "testing"] }}
"#,
            manifest_dir().display()
        ),
    )
    .unwrap();
    std::fs::write(app.path().join("src/main.rs"), NO_METRICS_APP).unwrap();
    std::fs::copy(
        manifest_dir().join("Cargo.lock"),
        app.path().join("Cargo.lock"),
    )
    .unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| manifest_dir().join("target"))
        .join("no-metrics");
    let tree = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            "redis-tb-client",
        ])
        .current_dir(app.path())
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&tree.stdout);
    assert!(tree.contains("redis-tb-client"), "{tree}");
    assert!(
        !tree.contains("opentelemetry"),
        "the limiter pulls the API in: {tree}"
    );
    let out = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--offline", "--", &server.url()])
        .current_dir(app.path())
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("no tb.* metric; app.requests exported"),
        "{stdout}"
    );
}

const NO_METRICS_APP: &str = r#"
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

fn main() {
    let url = std::env::args().nth(1).expect("the server's URL");
    let exporter = InMemoryMetricExporter::default();
    let reader = PeriodicReader::builder(exporter.clone())
        .with_interval(std::time::Duration::from_secs(24 * 3600))
        .build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    opentelemetry::global::set_meter_provider(provider.clone());
    provider.meter("app").u64_counter("app.requests").build().add(1, &[]);

    let timeouts = redis_tb_client::Timeouts {
        connect: std::time::Duration::from_secs(5),
        command: std::time::Duration::from_secs(10),
    };
    let client = redis_tb_client::redis::Client::open(url).unwrap();
    let mut limiter = redis_tb_client::RateLimiter::from_client(client, timeouts)
        .with_policy_name("api");
    assert!(limiter.take("nm:x", 1, 0.001, 1).unwrap().allowed);
    assert!(!limiter.take("nm:x", 1, 0.001, 1).unwrap().allowed);
    assert!(!limiter.wait_take("nm:x", 1, 0.001, 1, 100).unwrap().allowed);
    assert!(limiter.acquire("nm:l", 1, 60_000).unwrap().acquired);

    provider.force_flush().unwrap();
    let mut names = Vec::new();
    for batch in exporter.get_finished_metrics().unwrap() {
        for scope in batch.scope_metrics() {
            for metric in scope.metrics() {
                names.push(metric.name().to_string());
            }
        }
    }
    assert!(names.iter().all(|n| !n.starts_with("tb.")), "{names:?}");
    assert!(names.iter().any(|n| n == "app.requests"), "{names:?}");
    println!("no tb.* metric; app.requests exported");
}
"#;

//! The limiter's metrics (docs/clients.md#metrics), through OpenTelemetry's
//! metrics API (feature `metrics`): `tb.decisions`, `tb.decision.duration`,
//! `tb.waits` and `tb.leases`, under the meter `redis-tb` of the global
//! meter provider or of the one given to the limiter.
//!
//! Without the feature, [`Metrics`] is a zero-sized value with the same
//! methods, which do nothing: the rest of the crate calls it the same way
//! either way, and the feature's `cfg` stays in this file.

use crate::decision::{Decision, Source};
use crate::error::Result;
use crate::lease::LeaseDecision;
use std::time::Instant;

/// `tb.source`: where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The module or the Lua backend.
    Redis,
    /// The local limiter, during an outage.
    Local,
    /// The denial cache, without a round trip.
    DenialCache,
    /// Redis could not be reached and the request went ahead.
    UnavailableAllowed,
    /// Redis could not be reached and the request was refused (503), or a
    /// guard's lease counted lost because no renewal reached Redis.
    UnavailableDenied,
}

impl Origin {
    /// Where a guard's lost lease was decided: the server said it is gone,
    /// or no renewal could reach it for `lease_ms` (docs/clients.md#metrics).
    pub fn of_lost<T>(renewal: &Result<T>) -> Origin {
        match renewal {
            Err(e) if e.is_unavailable() => Origin::UnavailableDenied,
            _ => Origin::Redis,
        }
    }

    pub fn of(source: Source) -> Origin {
        match source {
            Source::Server => Origin::Redis,
            Source::Local => Origin::Local,
            Source::Cache => Origin::DenialCache,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Origin::Redis => "redis",
            Origin::Local => "local",
            Origin::DenialCache => "denial_cache",
            Origin::UnavailableAllowed => "unavailable_allowed",
            Origin::UnavailableDenied => "unavailable_denied",
        }
    }
}

/// A lease's `tb.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseOutcome {
    Acquired,
    Denied,
    /// A guard's renewal found its lease gone.
    Lost,
}

impl LeaseOutcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            LeaseOutcome::Acquired => "acquired",
            LeaseOutcome::Denied => "denied",
            LeaseOutcome::Lost => "lost",
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn allowed_str(allowed: bool) -> &'static str {
    if allowed {
        "allowed"
    } else {
        "denied"
    }
}

/// What a limiter records: cheap to clone (shared by the limiter's clones
/// and by a middleware made from it). The default records through the
/// global meter provider.
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    #[cfg(feature = "metrics")]
    recorder: otel::Handle,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Records through `provider`'s meter `redis-tb` instead of the global one.
    #[cfg(feature = "metrics")]
    pub fn with_provider(provider: &impl opentelemetry::metrics::MeterProvider) -> Metrics {
        Metrics {
            recorder: otel::Handle::of(provider),
        }
    }

    /// One decision (`tb.decisions`, `tb.decision.duration`) under the
    /// name `limit`, answered `started` ago.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn decision(&self, limit: &str, allowed: bool, origin: Origin, started: Instant) {
        #[cfg(feature = "metrics")]
        self.recorder
            .decision(limit, allowed_str(allowed), origin.as_str(), started);
    }

    /// One wait that ended (`tb.waits`): it got its tokens or lease, or it
    /// timed out.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn wait(&self, limit: &str, granted: bool) {
        #[cfg(feature = "metrics")]
        self.recorder.wait(limit, allowed_str(granted));
    }

    /// One lease acquired, denied or lost (`tb.leases`).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub fn lease(&self, limit: &str, outcome: LeaseOutcome, origin: Origin) {
        #[cfg(feature = "metrics")]
        self.recorder
            .lease(limit, outcome.as_str(), origin.as_str());
    }

    /// A take's outcome: a decision (named by its deciding policy, from
    /// where its source says); an error is not one.
    pub fn decided(&self, outcome: &Result<Decision>, started: Instant) {
        if let Ok(d) = outcome {
            self.decision(&d.policy, d.allowed, Origin::of(d.source()), started);
        }
    }

    /// A `wait_take`'s outcome: a decision and a wait.
    pub fn waited(&self, outcome: &Result<Decision>, started: Instant) {
        self.decided(outcome, started);
        if let Ok(d) = outcome {
            self.wait(&d.policy, d.allowed);
        }
    }

    /// An acquire's outcome under the name `limit`: acquired or denied by
    /// Redis, or (`fail_open` and Redis unavailable, or a decision that
    /// failed open already) acquired without a lease. A wait (`waited`)
    /// also counts in `tb.waits`, unless it failed open: it neither got a
    /// lease nor timed out.
    pub fn leased(
        &self,
        limit: &str,
        outcome: &Result<LeaseDecision>,
        fail_open: bool,
        waited: bool,
    ) {
        match outcome {
            Ok(d) if d.failed_open => {
                self.lease(limit, LeaseOutcome::Acquired, Origin::UnavailableAllowed)
            }
            Ok(d) => {
                let granted = d.acquired && d.lease.is_some();
                let outcome = if granted {
                    LeaseOutcome::Acquired
                } else {
                    LeaseOutcome::Denied
                };
                self.lease(limit, outcome, Origin::Redis);
                if waited {
                    self.wait(limit, granted);
                }
            }
            Err(e) if fail_open && e.is_unavailable() => {
                self.lease(limit, LeaseOutcome::Acquired, Origin::UnavailableAllowed)
            }
            Err(_) => {}
        }
    }
}

#[cfg(feature = "metrics")]
mod otel {
    use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider};
    use opentelemetry::{global, InstrumentationScope, Key, KeyValue, StringValue};
    use std::collections::HashMap;
    use std::sync::{Arc, OnceLock, RwLock};
    use std::time::Instant;

    const LIMIT: Key = Key::from_static_str("tb.limit");
    const OUTCOME: Key = Key::from_static_str("tb.outcome");
    const SOURCE: Key = Key::from_static_str("tb.source");

    /// The most limit names whose attribute value is kept. The names are
    /// the ones the application declared, so this is never reached in
    /// practice; past it a name's value is made per call rather than the
    /// map growing without bound.
    pub(super) const MAX_NAMES: usize = 1024;

    /// A limiter call takes from a fraction of a ms (a cached or local
    /// answer) to seconds (a wait): the SDK's default bounds are made for
    /// ms.
    const DURATION_BOUNDS: [f64; 16] = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ];

    fn scope() -> InstrumentationScope {
        InstrumentationScope::builder("redis-tb")
            .with_version(crate::VERSION)
            .build()
    }

    struct Instruments {
        decisions: Counter<u64>,
        duration: Histogram<f64>,
        waits: Counter<u64>,
        leases: Counter<u64>,
    }

    impl Instruments {
        fn new(meter: &Meter) -> Instruments {
            Instruments {
                decisions: meter
                    .u64_counter("tb.decisions")
                    .with_unit("{decision}")
                    .with_description("Rate-limit decisions, by limit, outcome and source")
                    .build(),
                duration: meter
                    .f64_histogram("tb.decision.duration")
                    .with_unit("s")
                    .with_description("Time from a take to its decision, a wait included")
                    .with_boundaries(DURATION_BOUNDS.to_vec())
                    .build(),
                waits: meter
                    .u64_counter("tb.waits")
                    .with_unit("{wait}")
                    .with_description("Waits for tokens or a lease, granted or timed out")
                    .build(),
                leases: meter
                    .u64_counter("tb.leases")
                    .with_unit("{lease}")
                    .with_description("Leases acquired, denied or lost")
                    .build(),
            }
        }
    }

    #[derive(Default)]
    struct Recorder {
        /// Made at the first record for the global provider, so that a
        /// limiter made before the application installs its provider
        /// still reaches it, and a limiter that records nothing costs nothing.
        instruments: OnceLock<Instruments>,
        /// Each limit name's attribute value, made once: a call then
        /// clones a reference count instead of copying the name.
        names: RwLock<HashMap<Box<str>, StringValue>>,
    }

    impl Recorder {
        fn instruments(&self) -> &Instruments {
            self.instruments
                .get_or_init(|| Instruments::new(&global::meter_with_scope(scope())))
        }

        fn name(&self, limit: &str) -> StringValue {
            if let Some(value) = self.names.read().ok().and_then(|n| n.get(limit).cloned()) {
                return value;
            }
            let value = StringValue::from(Arc::<str>::from(limit));
            if let Ok(mut names) = self.names.write() {
                if names.len() < MAX_NAMES {
                    names.insert(limit.into(), value.clone());
                }
            }
            value
        }
    }

    /// A limiter's recorder: the process's one for the global provider
    /// (made once), or one of its own for a given provider.
    #[derive(Clone)]
    pub(super) struct Handle(Arc<Recorder>);

    impl Default for Handle {
        fn default() -> Handle {
            static GLOBAL: OnceLock<Handle> = OnceLock::new();
            GLOBAL
                .get_or_init(|| Handle(Arc::new(Recorder::default())))
                .clone()
        }
    }

    impl Handle {
        pub fn of(provider: &impl MeterProvider) -> Handle {
            let instruments = Instruments::new(&provider.meter_with_scope(scope()));
            Handle(Arc::new(Recorder {
                instruments: OnceLock::from(instruments),
                names: RwLock::default(),
            }))
        }

        fn attributes(
            &self,
            limit: &str,
            outcome: &'static str,
            source: &'static str,
        ) -> [KeyValue; 3] {
            [
                KeyValue::new(LIMIT, self.0.name(limit)),
                KeyValue::new(OUTCOME, outcome),
                KeyValue::new(SOURCE, source),
            ]
        }

        pub fn decision(
            &self,
            limit: &str,
            outcome: &'static str,
            source: &'static str,
            started: Instant,
        ) {
            let attributes = self.attributes(limit, outcome, source);
            let instruments = self.0.instruments();
            instruments.decisions.add(1, &attributes);
            instruments
                .duration
                .record(started.elapsed().as_secs_f64(), &attributes);
        }

        pub fn wait(&self, limit: &str, outcome: &'static str) {
            let attributes = [
                KeyValue::new(LIMIT, self.0.name(limit)),
                KeyValue::new(OUTCOME, outcome),
            ];
            self.0.instruments().waits.add(1, &attributes);
        }

        pub fn lease(&self, limit: &str, outcome: &'static str, source: &'static str) {
            let attributes = self.attributes(limit, outcome, source);
            self.0.instruments().leases.add(1, &attributes);
        }

        #[cfg(test)]
        pub fn names(&self) -> usize {
            self.0.names.read().map(|n| n.len()).unwrap_or(0)
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    #[test]
    fn names_past_the_bound_are_still_recorded_and_the_map_stops_growing() {
        let exporter = InMemoryMetricExporter::default();
        let reader = PeriodicReader::builder(exporter.clone()).build();
        let provider = SdkMeterProvider::builder().with_reader(reader).build();
        let metrics = Metrics::with_provider(&provider);
        let names: Vec<String> = (0..otel::MAX_NAMES + 5).map(|i| format!("p{i}")).collect();
        for name in &names {
            metrics.lease(name, LeaseOutcome::Acquired, Origin::Redis);
        }
        metrics.lease("p0", LeaseOutcome::Acquired, Origin::Redis);
        assert_eq!(metrics.recorder.names(), otel::MAX_NAMES);
        provider.force_flush().unwrap();
        let batches = exporter.get_finished_metrics().unwrap();
        let leases = batches
            .iter()
            .flat_map(|b| b.scope_metrics())
            .flat_map(|s| s.metrics())
            .find(|m| m.name() == "tb.leases")
            .unwrap();
        let AggregatedMetrics::U64(MetricData::Sum(sum)) = leases.data() else {
            panic!("{leases:?}");
        };
        let total: u64 = sum.data_points().map(|p| p.value()).sum();
        assert_eq!(total, names.len() as u64 + 1);
    }
}

"""The limiter's metrics (docs/clients.md#metrics) through OpenTelemetry's
metrics API, an optional dependency (``pip install redis-tb[metrics]``).

The API is imported only when a limiter is made without a meter provider
of its own, and softly: without it a `Metrics` is off and every limiter
works the same, recording nothing. The drivers, the middleware and the
lease guards all record through the one `Metrics` of their limiter, and
only where they know the answer's source.
"""

from __future__ import annotations

from time import perf_counter
from typing import Optional

from . import _core

SCOPE = "redis-tb"

# tb.source: where an answer came from. `Decision.source` is the library's own
# older spelling of the first three.
REDIS = "redis"
LOCAL = "local"
DENIAL_CACHE = "denial_cache"
UNAVAILABLE_ALLOWED = "unavailable_allowed"
UNAVAILABLE_DENIED = "unavailable_denied"
SOURCES = {"server": REDIS, "local": LOCAL, "cache": DENIAL_CACHE}

# tb.outcome
ALLOWED = "allowed"
DENIED = "denied"
ACQUIRED = "acquired"
LOST = "lost"

#: The calls whose answer is a decision (take, take_limit, take_all,
#: wait_take); peek, refund, charge and settle answer with a Decision too,
#: but are not one.
DECISION_OPS = frozenset({"take", "takeall"})

#: Attribute sets kept, one per (limit, outcome, source). Limit names are
#: the application's declared policies, so this is never reached unless
#: names are made per request; past it each call builds its own set
#: rather than let the cache grow with them.
MAX_ATTRIBUTE_SETS = 1024

#: Bucket boundaries (s) suggested to the SDK for tb.decision.duration: its
#: default ones (0, 5, 10, 25, ... 10000) are meant for ms, and would put
#: every decision, a round trip of well under a second, in the first bucket.
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _global_meter(version: str):
    """The global provider's meter, or None without the API. Before the
    application installs an SDK this is the API's proxy, which starts
    recording into the SDK's provider once it is set."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    return metrics.get_meter(SCOPE, version)


class Metrics:
    """A limiter's four instruments, or nothing (`enabled` False: no API,
    or `enabled=False`); each method records one data point."""

    def __init__(self, meter_provider=None, *, enabled: bool = True):
        self.enabled = False
        self._attributes = {}
        if not enabled:
            return
        from . import __version__  # here: the package is imported by the time a limiter is made

        if meter_provider is None:
            meter = _global_meter(__version__)
            if meter is None:
                return
        else:
            if not callable(getattr(meter_provider, "get_meter", None)):
                raise _core.InvalidArgument(
                    f"meter_provider must be an OpenTelemetry MeterProvider, not {type(meter_provider).__name__}")
            meter = meter_provider.get_meter(SCOPE, __version__)
        self._decisions = meter.create_counter(
            "tb.decisions", unit="{decision}", description="Decisions of the rate limiter's takes")
        try:
            self._duration = meter.create_histogram(
                "tb.decision.duration", unit="s", description="Seconds from a take to its decision, waits included",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        except TypeError:  # opentelemetry-api before 1.30 takes no advice
            self._duration = meter.create_histogram(
                "tb.decision.duration", unit="s", description="Seconds from a take to its decision, waits included")
        self._waits = meter.create_counter(
            "tb.waits", unit="{wait}", description="Waits for tokens or a lease, granted or timed out")
        self._leases = meter.create_counter(
            "tb.leases", unit="{lease}", description="Leases acquired, denied or lost")
        self.enabled = True

    def _attrs(self, limit: str, outcome: str, source: Optional[str]) -> dict:
        # One dict per set, given to the API again and again: no allocation
        # on the hot path. A race of two threads makes two equal dicts, and
        # one of them is kept; both are right.
        key = (limit, outcome, source)
        attrs = self._attributes.get(key)
        if attrs is None:
            attrs = {"tb.limit": limit, "tb.outcome": outcome}
            if source is not None:
                attrs["tb.source"] = source
            if len(self._attributes) < MAX_ATTRIBUTE_SETS:
                self._attributes[key] = attrs
        return attrs

    def decision(self, limit: str, allowed: bool, source: str, started: float):
        """One decision (tb.decisions and tb.decision.duration); `started`:
        `perf_counter()` when the call began."""
        attrs = self._attrs(limit, ALLOWED if allowed else DENIED, source)
        self._decisions.add(1, attrs)
        self._duration.record(perf_counter() - started, attrs)

    def wait(self, limit: str, granted: bool):
        self._waits.add(1, self._attrs(limit, ALLOWED if granted else DENIED, None))

    def lease(self, limit: str, outcome: str, source: str = REDIS):
        self._leases.add(1, self._attrs(limit, outcome, source))

    def answered(self, call: "_core.Call", result, started: float, waited: bool):
        """What a limiter's call answered (a Decision or a Lease), counted
        if it is a decision or a lease; `waited`: a wait_take or a
        wait_acquire. A call that raised is not answered, so not counted."""
        op = call.op
        if op in DECISION_OPS:
            self.decision(result.policy, result.allowed, SOURCES.get(result.source, REDIS), started)
            if waited:
                self.wait(result.policy, result.allowed)
        elif op == "acquire":
            if result.failed_open:
                self.lease(result.policy, ACQUIRED, UNAVAILABLE_ALLOWED)
                return
            self.lease(result.policy, ACQUIRED if result.acquired else DENIED, REDIS)
            if waited:
                self.wait(result.policy, result.acquired)


#: What a limiter that has no `_metrics` (one of the application's own) records: nothing.
OFF = Metrics(enabled=False)


def of(limiter) -> Metrics:
    return getattr(limiter, "_metrics", None) or OFF


__all__ = ["Metrics"]

"""The metrics beyond clients/conformance/metrics.json (which
test_conformance.py runs): the middleware failing open and closed, its
local option and its in-flight lease, a lease guard that loses its lease,
the global meter provider, and a limiter without opentelemetry installed
(docs/clients.md#metrics). Each limiter gets a meter provider of its own,
read with the SDK's in-memory reader."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from time import perf_counter

import pytest
import redis
import redis.asyncio as aredis
from flask import Flask
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from redis_tb import AsyncRateLimiter, Concurrency, InvalidArgument, Policy, RateLimiter
from redis_tb import _metrics
from redis_tb.asgi import RateLimitMiddleware as AsgiLimit
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

from conftest import REPO, await_until, free_port, wait_until
from test_conformance import collected
from test_leases_middleware import asgi_request


class Read:
    """A meter provider of one limiter's own, and what it recorded."""

    def __init__(self):
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def points(self) -> dict:
        """{(instrument, ((attribute, value), ...) sorted): counter sum or histogram count}"""
        out = {}
        for name, (_metric, points) in collected(self.reader).items():
            for attrs, p in points.items():
                out[(name, tuple(sorted(attrs)))] = p.value if hasattr(p, "value") else p.count
        return out


def key(name, **attrs):
    return (name, tuple(sorted(("tb." + k, v) for k, v in attrs.items())))


def decisions(limit, outcome, source, n=1) -> dict:
    """The two data points of `n` decisions: tb.decisions and tb.decision.duration."""
    return {key("tb.decisions", limit=limit, outcome=outcome, source=source): n,
            key("tb.decision.duration", limit=limit, outcome=outcome, source=source): n}


@pytest.fixture
def read():
    r = Read()
    yield r
    r.provider.shutdown()


def flask_app(limiter, policies, **kw):
    app = Flask(__name__)
    app.add_url_rule("/", "hello", lambda: "hello")
    app.wsgi_app = WsgiLimit(app.wsgi_app, limiter, policies, **kw)
    return app.test_client()


async def hello(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def unreachable():
    return redis.Redis(port=free_port())


# --- the middleware -----------------------------------------------------------


@pytest.mark.parametrize("mode,status,outcome,source", [
    ("open", 200, "allowed", "unavailable_allowed"),
    ("closed", 503, "denied", "unavailable_denied"),
])
def test_wsgi_failing_open_or_closed_is_counted(read, mode, status, outcome, source):
    tc = flask_app(RateLimiter(unreachable(), meter_provider=read.provider), Policy(5, 1, "api"), on_unavailable=mode)
    assert [tc.get("/").status_code for _ in range(2)] == [status, status]
    assert read.points() == decisions("api", outcome, source, 2)


@pytest.mark.parametrize("mode,status,outcome,source", [
    ("open", 200, "allowed", "unavailable_allowed"),
    ("closed", 503, "denied", "unavailable_denied"),
])
def test_asgi_failing_open_or_closed_is_counted(read, mode, status, outcome, source):
    async def main():
        lim = AsyncRateLimiter(aredis.Redis(port=free_port()), meter_provider=read.provider)
        app = AsgiLimit(hello, lim, [Policy(5, 1, "sec"), Policy(100, 1, "day")], on_unavailable=mode)
        return [(await asgi_request(app))[0] for _ in range(2)]

    assert asyncio.run(main()) == [status, status]
    # several policies, no deciding one: the first names the decision
    assert read.points() == decisions("sec", outcome, source, 2)


def test_the_local_option_is_counted_as_local(read):
    lim = RateLimiter(unreachable(), on_unavailable="local", meter_provider=read.provider)
    tc = flask_app(lim, Policy(2, 0.001, "api"), on_unavailable="local")
    assert [tc.get("/").status_code for _ in range(3)] == [200, 200, 429]
    assert read.points() == {**decisions("api", "allowed", "local", 2), **decisions("api", "denied", "local")}


def test_the_in_flight_lease_is_counted(read, module_server):
    module_server.client().flushall()
    lim = RateLimiter(redis.Redis(port=module_server.port), meter_provider=read.provider)
    tc = flask_app(lim, Policy(5, 0.001, "api"), concurrency=Concurrency(1, name="busy"))
    response = tc.get("/")
    response.close()  # the server closes the body: the lease is released (else it renews on)
    assert response.status_code == 200
    assert read.points() == {key("tb.leases", limit="busy", outcome="acquired", source="redis"): 1,
                             **decisions("api", "allowed", "redis")}

    async def main():
        alim = AsyncRateLimiter(aredis.Redis(port=module_server.port), meter_provider=read.provider)
        gate = asyncio.Event()

        async def held(scope, receive, send):
            await gate.wait()
            await hello(scope, receive, send)

        app = AsgiLimit(held, alim, None, concurrency=Concurrency(1, name="busy"))
        first = asyncio.ensure_future(asgi_request(app))
        await await_until("the first request to hold the lease",
                          lambda: read.points().get(key("tb.leases", limit="busy", outcome="acquired",
                                                        source="redis")) == 2, 30)
        second = await asgi_request(app)
        gate.set()
        return (await first)[0], second[0]

    assert asyncio.run(main()) == (200, 429)
    assert read.points()[key("tb.leases", limit="busy", outcome="denied", source="redis")] == 1


@pytest.mark.parametrize("mode,status,outcome,source", [
    ("open", 200, "acquired", "unavailable_allowed"),
    ("closed", 503, "denied", "unavailable_denied"),
])
def test_an_in_flight_lease_that_fails_open_or_closed_is_counted(read, mode, status, outcome, source):
    lim = RateLimiter(unreachable(), meter_provider=read.provider)
    tc = flask_app(lim, Policy(5, 1, "api"), concurrency=Concurrency(3), on_unavailable=mode)
    assert tc.get("/").status_code == status
    allowed = "allowed" if mode == "open" else "denied"
    assert read.points() == {key("tb.leases", limit="inflight", outcome=outcome, source=source): 1,
                             **decisions("api", allowed, source)}


def test_a_limiter_bug_in_the_middleware_is_not_a_decision(read, module_server):
    module_server.client().set("ratelimit:{1.2.3.4}:api", "not a hash")
    lim = RateLimiter(redis.Redis(port=module_server.port), meter_provider=read.provider)
    tc = flask_app(lim, Policy(5, 1, "api"), key=lambda environ: "1.2.3.4")
    assert tc.get("/").status_code == 500
    assert read.points() == {}


# --- lease guards ---------------------------------------------------------------


def test_a_guard_that_loses_its_lease_is_counted_lost(read, module_server):
    lim = RateLimiter(redis.Redis(port=module_server.port), meter_provider=read.provider)
    with lim.lease("m:{lost}", 1, 300, policy="jobs") as guard:
        module_server.client().delete("m:{lost}")
        wait_until("the next renewal to answer 0", lambda: guard.lost, 30)
    assert read.points() == {key("tb.leases", limit="jobs", outcome="acquired", source="redis"): 1,
                             key("tb.leases", limit="jobs", outcome="lost", source="redis"): 1}

    async def main():
        alim = AsyncRateLimiter(aredis.Redis(port=module_server.port), meter_provider=read.provider)
        async with alim.lease("m:{alost}", 1, 300, policy="jobs") as guard:
            await alim.client.delete("m:{alost}")
            await await_until("the next renewal to answer 0", lambda: guard.lost, 30)
        await alim.close()

    asyncio.run(main())
    assert read.points()[key("tb.leases", limit="jobs", outcome="lost", source="redis")] == 2


def test_a_guard_that_fails_open_is_counted_unavailable_allowed(read):
    lim = RateLimiter(unreachable(), meter_provider=read.provider)
    with lim.lease("m:{open}", 1, 1000, policy="jobs", fail_open=True) as guard:
        assert guard.failed_open
    assert read.points() == {key("tb.leases", limit="jobs", outcome="acquired", source="unavailable_allowed"): 1}


def test_a_wait_acquire_is_one_wait_and_one_lease(read, setup):
    server, arg, _ = setup
    lim = RateLimiter(redis.Redis(port=server.port), backend=arg, timeout=1, meter_provider=read.provider)
    assert lim.wait_acquire("m:{w}", 1, 60_000, timeout_ms=5000, policy="jobs").acquired
    assert not lim.wait_acquire("m:{w}", 1, 60_000, timeout_ms=150, policy="jobs").acquired
    assert read.points() == {key("tb.leases", limit="jobs", outcome="acquired", source="redis"): 1,
                             key("tb.leases", limit="jobs", outcome="denied", source="redis"): 1,
                             key("tb.waits", limit="jobs", outcome="allowed"): 1,
                             key("tb.waits", limit="jobs", outcome="denied"): 1}


# --- the Metrics itself -------------------------------------------------------


def test_attribute_sets_are_made_once_and_bounded(read):
    m = _metrics.Metrics(read.provider)
    assert m.enabled
    assert m._attrs("api", "allowed", "redis") is m._attrs("api", "allowed", "redis")
    names = _metrics.MAX_ATTRIBUTE_SETS + 100  # under the SDK's own limit of series (2000)
    for i in range(names):
        m.lease(f"name{i}", "acquired")
    assert len(m._attributes) == _metrics.MAX_ATTRIBUTE_SETS
    # past the bound each call makes its own set, and is still recorded
    assert read.points()[key("tb.leases", limit=f"name{names - 1}", outcome="acquired", source="redis")] == 1


def test_a_meter_provider_must_be_one():
    with pytest.raises(InvalidArgument):
        RateLimiter(unreachable(), meter_provider="prometheus")
    with pytest.raises(InvalidArgument):
        AsyncRateLimiter(aredis.Redis(port=1), meter_provider=object())


def run_python(code: str, server) -> str:
    """`code` in a new interpreter, from tests/ (so redis_tb is the installed
    package), with REDIS_PORT set; its stdout."""
    env = dict(os.environ, REDIS_PORT=str(server.port))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO / "clients" / "python" / "tests",
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_global_meter_provider_is_the_default(module_server):
    """Set after the limiter was made, as an app often does: the API's proxy
    forwards to it from then on."""
    out = run_python("""
        import os, redis
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from redis_tb import RateLimiter

        lim = RateLimiter(redis.Redis(port=int(os.environ["REDIS_PORT"])))
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        lim.take("m:global", 5, 1, policy="api")
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        print(sm.scope.name, m.name, dict(p.attributes)["tb.source"])
    """, module_server)
    assert sorted(out.split("\n")[:-1]) == ["redis-tb tb.decision.duration redis", "redis-tb tb.decisions redis"]


def test_without_opentelemetry_the_limiter_works_and_records_nothing(module_server):
    """opentelemetry made unimportable (None in sys.modules: an import of it
    raises ImportError, as when it is not installed) before redis_tb is
    imported: every kind of call works, and nothing imported it."""
    out = run_python("""
        import sys
        sys.modules["opentelemetry"] = None
        import asyncio, os, redis, redis.asyncio
        from redis_tb import AsyncRateLimiter, Concurrency, Policy, RateLimiter
        from redis_tb.wsgi import RateLimitMiddleware

        port = int(os.environ["REDIS_PORT"])
        lim = RateLimiter(redis.Redis(port=port))
        print(lim._metrics.enabled, lim.take("m:none", 1, 0.001).allowed, lim.take("m:none", 1, 0.001).allowed)
        print(lim.wait_take("m:none2", 1, 0.001, timeout_ms=100).allowed, lim.acquire("m:{l}", 1, 1000).acquired)
        with lim.lease("m:{g}", 1, 1000) as guard:
            print(guard.lease is not None)
        mw = RateLimitMiddleware(lambda e, s: s("200 OK", []) or [b"ok"], lim, Policy(5, 1), concurrency=Concurrency(2))
        body = mw({"REMOTE_ADDR": "10.1.1.1"}, lambda status, headers, exc=None: print(status))
        print(b"".join(body).decode())
        body.close()
        down = RateLimiter(redis.Redis(port=1), on_unavailable="local")
        print(down.take("m:down", 1, 1).source, down.acquire("m:{d}", 1, 1000, fail_open=True).failed_open)
        print(len(lim.top(3)) >= 1)

        async def main():
            alim = AsyncRateLimiter(redis.asyncio.Redis(port=port))
            print(alim._metrics.enabled, (await alim.take("m:anone", 1, 1)).allowed)
            await alim.close()

        asyncio.run(main())
        print(sys.modules["opentelemetry"] is None)
    """, module_server)
    assert out.splitlines() == ["False True False", "True True", "True", "200 OK", "ok", "local True", "True",
                                "False True", "True"]


# --- the README's example ------------------------------------------------------


def metrics_example() -> str:
    """README.md's "### Metrics" code block (a plain block: the release's
    README test runs the ```python blocks without opentelemetry installed)."""
    readme = (REPO / "clients" / "python" / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Metrics"):]
    return re.search(r"^```\n(.*?)^```", section, re.M | re.S).group(1)


def test_the_readme_metrics_example_runs(module_server):
    env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{module_server.port}")
    out = subprocess.run([sys.executable, "-c", metrics_example()], cwd=REPO / "clients" / "python" / "tests",
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tb.decisions" in out.stdout and "redis" in out.stdout


def test_durations_are_bucketed_in_seconds(read):
    """The SDK's default boundaries are for ms; the limiter advises its own
    where the API takes advice (opentelemetry-api 1.30 on)."""
    import inspect

    from opentelemetry.metrics import Meter

    m = _metrics.Metrics(read.provider)
    m.decision("api", True, "redis", perf_counter())
    (_metric, points), = [v for k, v in collected(read.reader).items() if k == "tb.decision.duration"]
    (point,) = points.values()
    if "explicit_bucket_boundaries_advisory" in inspect.signature(Meter.create_histogram).parameters:
        assert tuple(point.explicit_bounds) == _metrics.DURATION_BUCKETS
    else:
        assert point.count == 1

"""docs/clients.md#the-same-behaviour-in-all-three: the table cases of
clients/conformance/behaviour.json (no server), and the middleware's
in-flight limit before its rate limit and its default key, in ASGI and
WSGI against a real server."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import threading
from pathlib import Path

import pytest
import redis

from redis_tb import AsyncRateLimiter, Concurrency, Decision, InvalidArgument, Lease, Limit, Policy, RateLimiter, bucket_key
from redis_tb import _middleware as mw
from redis_tb import asgi, wsgi
from redis_tb.asgi import RateLimitMiddleware as AsgiLimit
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

from conftest import async_limiter
from test_leases_middleware import asgi_app, wsgi_app

BEHAVIOUR = json.loads((Path(__file__).resolve().parents[2] / "conformance" / "behaviour.json").read_text())


@pytest.mark.parametrize("case", BEHAVIOUR["default_key"], ids=lambda c: str(c["remote"]))
def test_the_default_key_is_the_peer_address_with_ipv4_mapped_addresses_unmapped(case):
    remote = case["remote"]
    assert asgi.client_ip({"client": None if remote is None else (remote, 4321)}) == case["id"]
    assert wsgi.client_ip({} if remote is None else {"REMOTE_ADDR": remote}) == case["id"]


def _concurrency(case):
    c = case.get("concurrency")
    return None if c is None else Concurrency(c["limit"], name=c["name"])


@pytest.mark.parametrize("case", BEHAVIOUR["policy_header"], ids=lambda c: c["header"])
def test_one_ratelimit_policy_line_rate_first(case):
    policies = [Policy(p["capacity"], p["rate"], p["name"]) for p in case["policies"]]
    concurrency = _concurrency(case)
    assert mw.policy_line(policies, concurrency) == case["header"]
    # What an allowed request sends: its rate decision's line, then its lease's.
    limits = tuple((p.name, p.capacity, p.rate) for p in policies)
    d = Decision(True, 0, 0, 0, 0 if len(limits) > 1 else None, limits[0][1], limits[0][2], limits[0][0],
                 limits if len(limits) > 1 else ())
    lease = None if concurrency is None else Lease(True, 0, 0, "1", "k", concurrency.limit, 60_000, concurrency.name)
    lines = [v for k, v in mw.merged_headers(d, lease) if k == "RateLimit-Policy"]
    assert lines == [case["header"]]


def _number(x):
    return float(x) if isinstance(x, str) else x


@pytest.mark.parametrize("case", BEHAVIOUR["invalid_limits"], ids=lambda c: repr(c))
def test_a_limit_is_refused_when_it_is_made(case):
    with pytest.raises(InvalidArgument):
        Limit(case["key"], _number(case["capacity"]), _number(case["rate"]), _number(case["n"]), case["name"])


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def test_the_shared_option_names_and_defaults():
    want = BEHAVIOUR["defaults"]
    for limiter in (RateLimiter, AsyncRateLimiter):
        for name in ("module_recheck_ms", "instances", "local_max_keys", "local_probe_ms", "cache_denials"):
            assert _default(limiter, name) == want[name], (limiter, name)
        assert _default(limiter, "on_unavailable") == want["on_unavailable_limiter"]
    for middleware in (AsgiLimit, WsgiLimit):
        assert _default(middleware, "prefix") == want["prefix"]
        app = middleware(None, RateLimiter(redis.Redis(port=1)), Policy(1, 1))
        assert app.on_unavailable == want["on_unavailable_middleware"]
    assert Concurrency(1).lease_ms == want["lease_ms"] and Concurrency(1).name == want["concurrency_name"]


def test_the_middleware_takes_on_unavailable_and_the_older_fail_open():
    lim = RateLimiter(redis.Redis(port=1))
    local = RateLimiter(redis.Redis(port=1), on_unavailable="local")
    made = lambda limiter=lim, **kw: WsgiLimit(None, limiter, Policy(1, 1), **kw)
    assert made(fail_open=False).on_unavailable == "closed" and made(fail_open=True).on_unavailable == "open"
    assert made(on_unavailable="closed").on_unavailable == "closed"
    assert made(local, on_unavailable="local").on_unavailable == "local"
    for bad in (dict(on_unavailable="shut"), dict(on_unavailable="closed", fail_open=True),
                dict(on_unavailable="local")):  # local needs the limiter's local limiter
        with pytest.raises(InvalidArgument):
            made(**bad)


# --- in flight before rate, in both middleware, on a real server -------------

INFLIGHT = bucket_key("ratelimit:", "10.0.0.1", "inflight")
RATE = bucket_key("ratelimit:", "10.0.0.1", "default")


def asgi_get(app, client=("10.0.0.1", 1234)):
    from test_leases_middleware import asgi_request

    async def go():
        scope_app = _with_client(app, client)
        return await asgi_request(scope_app)

    return go()


def _with_client(app, client):
    async def wrapped(scope, receive, send):
        return await app(dict(scope, client=client), receive, send)

    return wrapped


def wsgi_get(app, remote="10.0.0.1"):
    from test_leases_middleware import wsgi_request

    return wsgi_request(lambda environ, start: app(dict(environ, REMOTE_ADDR=remote), start))


def test_asgi_checks_in_flight_before_rate(module_server):
    async def main():
        async with async_limiter(module_server.port) as (client, lim):
            await client.delete(INFLIGHT, RATE)
            app = AsgiLimit(asgi_app(asyncio.Event()), lim, Policy(1, 0.001), concurrency=Concurrency(1))
            held = await lim.acquire(INFLIGHT, 1, 30_000, policy="inflight")
            code, headers, _ = await asgi_get(app)
            assert code == 429 and headers["ratelimit-policy"] == '"default";q=1;w=1000, "inflight";q=1;qu="concurrent-requests"'
            assert not await client.exists(RATE), "a request refused for concurrency spent a rate token"
            await lim.release(INFLIGHT, held)
            assert (await asgi_get(app))[0] == 200
            code, headers, _ = await asgi_get(app)  # the rate denial gives its lease back
            assert code == 429 and headers["ratelimit"].startswith('"default";r=0')
            assert await client.zcard(INFLIGHT) == 2  # only `seq` and `inc`: no lease held

    asyncio.run(main())


def test_wsgi_checks_in_flight_before_rate(module_server):
    client = redis.Redis(port=module_server.port)
    client.delete(INFLIGHT, RATE)
    with RateLimiter(client) as lim:
        app = WsgiLimit(wsgi_app(threading.Event()), lim, Policy(1, 0.001), concurrency=Concurrency(1))
        held = lim.acquire(INFLIGHT, 1, 30_000, policy="inflight")
        code, headers, _ = wsgi_get(app)
        assert code == 429 and headers["ratelimit-policy"] == '"default";q=1;w=1000, "inflight";q=1;qu="concurrent-requests"'
        assert not client.exists(RATE), "a request refused for concurrency spent a rate token"
        lim.release(INFLIGHT, held)
        assert wsgi_get(app)[0] == 200
        code, headers, _ = wsgi_get(app)
        assert code == 429 and headers["ratelimit"].startswith('"default";r=0')
        assert client.zcard(INFLIGHT) == 2
    client.close()


def test_both_middleware_key_an_ipv4_mapped_peer_as_ipv4(module_server):
    client = redis.Redis(port=module_server.port)
    key = bucket_key("ratelimit:", "192.0.2.9", "default")
    client.delete(key)
    with RateLimiter(client) as lim:
        app = WsgiLimit(wsgi_app(threading.Event()), lim, Policy(10, 0.001))
        assert wsgi_get(app, "::ffff:192.0.2.9")[0] == 200

    async def main():
        async with async_limiter(module_server.port) as (_, alim):
            app = AsgiLimit(asgi_app(asyncio.Event()), alim, Policy(10, 0.001))
            code, headers, _ = await asgi_get(app, ("::ffff:192.0.2.9", 1))
            assert headers["ratelimit"].startswith('"default";r=8')  # the WSGI request's bucket

    asyncio.run(main())
    assert client.hget(key, "tokens") is not None
    client.close()

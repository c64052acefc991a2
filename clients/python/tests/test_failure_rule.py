"""The one failure rule (docs/clients.md#the-failure-rule) against real
servers: unavailable (fast, logged once, counted), server changed (detect
again, retry once, go back to the module), bug (raised, 500, never open),
invalid settings refused at creation, startup while the server is down."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time

import pytest
import redis
import redis.asyncio as aredis
from flask import Flask
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from redis_tb import (
    AsyncRateLimiter,
    InvalidArgument,
    Limit,
    LimiterError,
    LimiterReplyError,
    LimiterUnavailable,
    Policy,
    RateLimiter,
)
from redis_tb.asgi import RateLimitMiddleware as AsgiLimit
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

from conftest import Server, free_port
from test_api import SLOW


def records(caplog, level):
    return [r for r in caplog.records if r.name == "redis_tb" and r.levelno == level]


def flask_app(limiter, policies, **kw):
    app = Flask(__name__)
    app.add_url_rule("/", "hello", lambda: "hello")
    app.wsgi_app = WsgiLimit(app.wsgi_app, limiter, policies, **kw)
    return app


def starlette_app(limiter, policies, **kw):
    async def hello(request):
        return PlainTextResponse("hello")

    return AsgiLimit(Starlette(routes=[Route("/", hello)]), limiter, policies, **kw)


# --- invalid settings --------------------------------------------------------


@pytest.mark.parametrize("capacity,rate", [(0, 1), (5, -1), (5, 0), (-1, 1), (2**53 + 1, 1), (float("nan"), 1),
                                           (5, float("inf"))])
def test_a_policy_that_cannot_limit_is_refused_when_created(capacity, rate):
    with pytest.raises(InvalidArgument):
        Policy(capacity, rate)
    with pytest.raises(InvalidArgument):
        Limit("k", capacity, rate)


def test_a_policy_name_that_is_not_printable_ascii_is_refused():
    for bad in ("", "s\u00e9c", "a\nb"):
        with pytest.raises(InvalidArgument):
            Policy(5, 1, bad)


def test_the_middleware_refuses_what_is_not_a_policy():
    lim = RateLimiter(redis.Redis(port=free_port()))
    for bad in ([], [(5, 1)], "5/s", [Policy(5, 1, "a"), Policy(6, 1, "a")]):
        with pytest.raises(InvalidArgument):
            WsgiLimit(lambda e, s: [], lim, bad)


def test_invalid_argument_is_a_value_error():
    assert issubclass(InvalidArgument, ValueError) and issubclass(InvalidArgument, LimiterError)


# --- bugs: never open --------------------------------------------------------


def test_a_cost_the_server_would_refuse_answers_500_and_logs_an_error(plain_server, caplog):
    plain_server.client().flushall()
    app = flask_app(RateLimiter(redis.Redis(port=plain_server.port)), Policy(10, 1), cost=lambda environ: 1e30)
    tc = app.test_client()
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        statuses = [tc.get("/").status_code for _ in range(2)]
    assert statuses == [500, 500]
    errors = records(caplog, logging.ERROR)
    assert len(errors) == 2 and "n must be at most" in errors[0].getMessage()
    assert records(caplog, logging.WARNING) == []


@pytest.mark.parametrize("server", ["module_server", "plain_server"])
def test_a_bucket_holding_a_string_answers_500_in_wsgi(request, server, caplog):
    server = request.getfixturevalue(server)
    with server.client() as r:
        r.flushall()
        r.set("ratelimit:{10.0.0.1}:default", "not a bucket")
    app = flask_app(RateLimiter(redis.Redis(port=server.port)), Policy(10, 1))
    tc = app.test_client()
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        r = tc.get("/", environ_base={"REMOTE_ADDR": "10.0.0.1"})
    assert r.status_code == 500 and r.headers["Content-Type"] == "application/problem+json"
    assert json.loads(r.data)["status"] == 500
    assert "WRONGTYPE" in records(caplog, logging.ERROR)[0].getMessage()
    assert tc.get("/", environ_base={"REMOTE_ADDR": "10.0.0.2"}).status_code == 200


def test_a_bucket_holding_a_string_calls_the_asgi_error_handler(module_server, caplog):
    with module_server.client() as r:
        r.flushall()
        r.set("ratelimit:{testclient}:default", "not a bucket")
    seen = []

    def on_error(error, scope):
        seen.append(error)

        async def teapot(scope, receive, send):
            await send({"type": "http.response.start", "status": 418, "headers": []})
            await send({"type": "http.response.body", "body": b"tea"})

        return teapot

    app = starlette_app(AsyncRateLimiter(aredis.Redis(port=module_server.port)), Policy(10, 1), on_error=on_error)
    with caplog.at_level(logging.INFO, logger="redis_tb"), TestClient(app) as tc:
        assert tc.get("/").status_code == 418
    assert isinstance(seen[0], LimiterReplyError) and seen[0].message.startswith("WRONGTYPE")
    assert app.outcomes.error_count == 1 and app.outcomes.unavailable_count == 0
    assert len(records(caplog, logging.ERROR)) == 1


def test_an_acl_that_forbids_the_command_is_a_bug_not_an_outage(plain_server):
    with plain_server.client() as r:
        r.flushall()
        r.execute_command("ACL", "SETUSER", "nofcall", "on", "nopass", "+@all", "-fcall", "~*")
    lim = RateLimiter(redis.Redis(port=plain_server.port, username="nofcall", password="x"))
    with pytest.raises(LimiterReplyError, match="^NOPERM"):
        lim.take("k", 5, 1)
    lim.close()


def test_an_error_reply_to_command_info_means_no_module(module_server):
    """As Node and Rust: an ACL that forbids COMMAND makes the limiter use Lua."""
    with module_server.client() as r:
        r.flushall()
        r.execute_command("ACL", "SETUSER", "nocommand", "on", "nopass", "+@all", "-command", "~*")
    with RateLimiter(redis.Redis(port=module_server.port, username="nocommand", password="x")) as lim:
        assert lim.take("k", 5, SLOW).remaining == 4
        assert lim.backend == "function"


# --- unavailable: fast, counted, logged once ---------------------------------


def test_a_refused_connection_fails_at_once_sync_and_async():
    port = free_port()  # nothing listens there
    lim = RateLimiter(redis.Redis(port=port), timeout=2)
    started = time.monotonic()
    for _ in range(5):
        with pytest.raises(LimiterUnavailable):
            lim.take("k", 5, 1)
    assert time.monotonic() - started < 5  # waiting out the 2 s timeout each would be 10 s

    async def main():
        alim = AsyncRateLimiter(aredis.Redis(port=port), timeout=2)
        started = time.monotonic()
        for _ in range(5):
            with pytest.raises(LimiterUnavailable):
                await alim.take("k", 5, 1)
        return time.monotonic() - started

    assert asyncio.run(main()) < 5


def test_the_middleware_counts_every_unavailable_call_and_logs_once(own_server, caplog):
    app = flask_app(RateLimiter(redis.Redis(port=own_server.port)), Policy(10, 1))
    tc = app.test_client()
    assert tc.get("/").headers["RateLimit"]
    caplog.clear()  # the backend choice (a WARNING on this server without the module)
    own_server.kill()
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        assert [tc.get("/").status_code for _ in range(4)] == [200] * 4
    mw = app.wsgi_app
    assert mw.outcomes.unavailable_count == 4 and mw.outcomes.error_count == 0
    assert len(records(caplog, logging.WARNING)) == 1 and records(caplog, logging.ERROR) == []


def test_an_outage_is_printed_without_any_logging_configured(tmp_path):
    """Python's last-resort handler prints WARNING and above: an outage is
    not silent in an app that never configured logging."""
    code = (
        "import redis, redis_tb\n"
        "from redis_tb.wsgi import RateLimitMiddleware\n"
        f"mw = RateLimitMiddleware(lambda e, s: s('200 OK', []) or [b'ok'], redis_tb.RateLimiter(redis.Redis(port={free_port()})),"
        " redis_tb.Policy(5, 1))\n"
        "print(b''.join(mw({'REMOTE_ADDR': '1.2.3.4'}, lambda *a: None)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.stdout.strip() == "b'ok'"
    assert "rate limiter unavailable, letting requests through" in out.stderr


# --- startup while the server is down ----------------------------------------


def test_a_limiter_created_while_the_server_is_down_connects_when_it_comes_up():
    port = free_port()
    lim = RateLimiter(redis.Redis(port=port))
    app = flask_app(lim, Policy(10, SLOW)).test_client()
    with pytest.raises(LimiterUnavailable):
        lim.take("k", 5, SLOW)
    assert lim.backend is None
    assert app.get("/").status_code == 200 and "RateLimit" not in app.get("/").headers
    server = Server(module=True, port=port)
    try:
        assert lim.take("k", 5, SLOW).remaining == 4 and lim.backend == "module"
        assert app.get("/").headers["RateLimit"] == '"default";r=9;t=1000'
    finally:
        lim.close()
        server.stop()


def test_an_async_limiter_created_while_the_server_is_down_connects_when_it_comes_up():
    port = free_port()

    async def main():
        lim = AsyncRateLimiter(aredis.Redis(port=port))
        with pytest.raises(LimiterUnavailable):
            await lim.take("k", 5, SLOW)
        server = Server(module=False, port=port)
        try:
            assert (await lim.take("k", 5, SLOW)).remaining == 4 and lim.backend == "function"
        finally:
            await lim.close()
            server.stop()

    asyncio.run(main())


# --- the server changed ------------------------------------------------------


def test_the_limiter_goes_on_with_lua_when_the_module_goes_away_and_back_when_it_returns(own_module_server, caplog):
    server = own_module_server
    lim = RateLimiter(redis.Redis(port=server.port))
    assert lim.take("m:k", 10, SLOW, 2).remaining == 8 and lim.backend == "module"
    server.restart(module=False)
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        assert lim.take("m:k", 10, SLOW, 2).remaining == 8  # a new, empty server
        assert lim.backend == "function"
        assert lim.wait_take("m:k", 10, SLOW, 1, timeout_ms=100).remaining == 7
    warnings = [r.getMessage() for r in records(caplog, logging.WARNING)]
    assert len(warnings) == 1 and "module went away" in warnings[0]
    caplog.clear()
    server.restart(module=True)
    lim._state.recheck_s = 0  # the 30 s between looks for the module, for the test
    lim._state.next_module_check = 0
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        assert lim.take("m:k", 10, SLOW, 1).remaining == 9
        assert lim.backend == "module"
    assert any("module is back" in r.getMessage() for r in records(caplog, logging.INFO))
    lim.close()


def test_on_lua_the_limiter_looks_for_the_module_at_most_every_30_s(own_module_server):
    server = own_module_server
    lim = RateLimiter(redis.Redis(port=server.port))
    assert lim.take("m:k", 10, SLOW).allowed and lim.backend == "module"
    server.restart(module=False)
    assert lim.take("m:k", 10, SLOW).allowed and lim.backend == "function"
    server.client().execute_command("MODULE", "LOAD", __import__("conftest").module_path())
    assert lim.take("m:k", 10, SLOW).allowed and lim.backend == "function"  # not yet: 30 s
    assert 29 < lim._state.next_module_check - time.monotonic() <= 30
    lim.close()


def test_the_async_limiter_goes_on_with_lua_when_the_module_goes_away(own_module_server):
    server = own_module_server

    async def main():
        async with AsyncRateLimiter(aredis.Redis(port=server.port)) as lim:
            assert (await lim.take("m:a", 5, SLOW)).remaining == 4 and lim.backend == "module"
            server.restart(module=False)
            assert (await lim.take("m:a", 5, SLOW)).remaining == 4 and lim.backend == "function"

    asyncio.run(main())


def test_the_middleware_keeps_limiting_after_the_module_went_away(own_module_server):
    server = own_module_server
    tc = flask_app(RateLimiter(redis.Redis(port=server.port)), Policy(2, SLOW)).test_client()
    assert tc.get("/").headers["RateLimit"] == '"default";r=1;t=1000'
    server.restart(module=False)
    assert [tc.get("/").status_code for _ in range(3)] == [200, 200, 429]


def test_a_function_flushed_under_the_limiter_is_loaded_again(plain_server):
    with plain_server.client() as r:
        r.flushall()
    with RateLimiter(redis.Redis(port=plain_server.port)) as lim:
        assert lim.take("f:k", 5, SLOW).remaining == 4 and lim.backend == "function"
        with plain_server.client() as r:
            r.execute_command("FUNCTION", "FLUSH")
        assert lim.peek("f:k", 5, SLOW).remaining == 3  # FCALL_RO: "Function not found", then loaded
        assert lim.take("f:k", 5, SLOW).remaining == 3


# --- waiting without a limit, close() ----------------------------------------


def test_wait_take_without_a_limit_outlasts_the_command_timeout(module_server):
    """timeout_ms=0 waits for ever on TB.BTAKE, not for the limiter's 0.2 s timeout."""
    server, arg = module_server, "auto"
    server.client().flushall()

    def refund_later(delay, key="w:zero"):
        time.sleep(delay)
        with server.client() as r:
            RateLimiter(r).refund(key, 1, SLOW, 1)

    import threading

    with RateLimiter(redis.Redis(port=server.port), backend=arg) as lim:
        assert lim.take("w:zero", 1, SLOW).allowed
        t = threading.Thread(target=refund_later, args=(0.7,))
        t.start()
        started = time.monotonic()
        d = lim.wait_take("w:zero", 1, SLOW, timeout_ms=0)
        t.join()
        assert d.allowed and time.monotonic() - started > 0.5

    async def main():
        async with AsyncRateLimiter(aredis.Redis(port=server.port), backend=arg) as alim:
            assert (await alim.take("w:zero2", 1, SLOW)).allowed
            t = threading.Thread(target=refund_later, args=(0.7, "w:zero2"))
            t.start()
            d = await alim.wait_take("w:zero2", 1, SLOW, timeout_ms=0)
            t.join()
            return d

    assert asyncio.run(main()).allowed


def client_count(server, name="tb-close-test") -> int:
    with server.client() as r:
        return sum(1 for c in r.client_list() if c.get("name") == name)


def test_close_releases_every_connection_after_concurrent_waits(module_server):
    import threading

    with module_server.client() as r:
        r.flushall()
    before = client_count(module_server)
    assert before == 0
    lim = RateLimiter(redis.Redis(port=module_server.port, client_name="tb-close-test"))
    lim.take("c:k", 5, 20, 5)  # drained; 20 tokens/s
    threads = [threading.Thread(target=lim.wait_take, args=("c:k", 5, 20), kwargs={"timeout_ms": 3000})
               for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client_count(module_server) > before
    lim.close()
    deadline = time.monotonic() + 5
    while client_count(module_server) != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client_count(module_server) == before


def test_async_close_releases_every_connection_after_concurrent_waits(module_server):
    with module_server.client() as r:
        r.flushall()
    before = client_count(module_server)
    assert before == 0

    async def main():
        async with AsyncRateLimiter(aredis.Redis(port=module_server.port, client_name="tb-close-test")) as lim:
            await lim.take("c:a", 5, 20, 5)
            await asyncio.gather(*(lim.wait_take("c:a", 5, 20, timeout_ms=3000) for _ in range(5)))
            assert client_count(module_server) > before

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while client_count(module_server) != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client_count(module_server) == before



def test_a_fixed_cost_the_server_would_refuse_is_refused_when_the_middleware_is_created():
    lim = RateLimiter(redis.Redis(port=free_port()))
    for bad in (1e30, -1, float("nan"), "1"):
        with pytest.raises(InvalidArgument):
            WsgiLimit(lambda e, s: [], lim, Policy(5, 1), cost=bad)
        with pytest.raises(InvalidArgument):
            AsgiLimit(None, AsyncRateLimiter(aredis.Redis(port=free_port())), Policy(5, 1), cost=bad)
    assert WsgiLimit(lambda e, s: [], lim, Policy(5, 1), cost=2).cost == 2


def test_the_client_side_errors_fall_in_their_class():
    import redis.exceptions as rex

    from redis_tb._core import BUG, UNAVAILABLE, classify

    for error in (rex.ConnectionError("refused"), rex.TimeoutError("slow"), asyncio.TimeoutError(),
                  ConnectionResetError(), rex.BusyLoadingError("loading"), rex.ClusterError("TTL exhausted"),
                  rex.SlotNotCoveredError("no node"), rex.ClusterDownError("The cluster is down"),
                  rex.TryAgainError(), LimiterUnavailable("x")):
        assert classify(error) == UNAVAILABLE, error
    for error in (rex.RedisClusterException("TB.TAKEALL - all keys must map to the same key slot"),
                  rex.ResponseError("WRONGTYPE Operation against a key"), rex.DataError("bad"),
                  TypeError("x"), LimiterError("unexpected reply")):
        assert classify(error) == BUG, error

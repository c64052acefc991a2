"""Fail open, fast, with one log line per outage: the server stopped
(SIGSTOP: it hangs) and killed; fail closed answers 503."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis
import redis.asyncio as aredis
from flask import Flask
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from redis_tb import AsyncRateLimiter, LimiterUnavailable, Policy, RateLimiter
from redis_tb.asgi import RateLimitMiddleware as AsgiLimit
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

REQUESTS = 15


def flask_client(server, **kw):
    app = Flask(__name__)
    app.add_url_rule("/", "hello", lambda: "hello")
    # the client's own settings are redis-py's defaults (5 s, 10 retries): the limiter's 0.2 s apply
    app.wsgi_app = WsgiLimit(app.wsgi_app, RateLimiter(redis.Redis(port=server.port)), Policy(100, 1), **kw)
    return app.test_client()


def asgi_client(server, **kw):
    async def hello(request):
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])
    lim = AsyncRateLimiter(aredis.Redis(port=server.port))
    return TestClient(AsgiLimit(app, lim, Policy(100, 1), **kw))


def records(caplog, level):
    return [r for r in caplog.records if r.name == "redis_tb" and r.levelno == level]


def outage(get, server, caplog, how):
    """REQUESTS requests while the server is down (`how`): all pass, each
    fast, no rate-limit headers, one warning; then one info on recovery."""
    assert get().headers["RateLimit"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        if how == "hung":
            server.pause()
        else:
            server.kill()
        try:
            for _ in range(REQUESTS):
                started = time.monotonic()
                r = get()
                took = time.monotonic() - started
                assert r.status_code == 200 and "RateLimit" not in r.headers
                assert took < 1.0, took
        finally:
            if how == "hung":
                server.resume()
        assert len(records(caplog, logging.WARNING)) == 1
        assert "rate limiter unavailable" in records(caplog, logging.WARNING)[0].getMessage()
        if how == "hung":
            r = get()
            assert r.status_code == 200 and r.headers["RateLimit"]
            assert [x.getMessage() for x in records(caplog, logging.INFO)] == [
                "redis-tb: rate limiter available again"]
            assert len(records(caplog, logging.WARNING)) == 1


@pytest.mark.parametrize("how", ["hung", "stopped"])
def test_wsgi_fails_open(own_server, caplog, how):
    tc = flask_client(own_server)
    outage(lambda: tc.get("/"), own_server, caplog, how)


@pytest.mark.parametrize("how", ["hung", "stopped"])
def test_asgi_fails_open(own_server, caplog, how):
    with asgi_client(own_server) as tc:
        outage(lambda: tc.get("/"), own_server, caplog, how)


def test_fail_closed_answers_503(own_server, caplog):
    tc = flask_client(own_server, fail_open=False)
    assert tc.get("/").status_code == 200
    caplog.clear()  # the backend choice (a WARNING on this server without the module)
    own_server.pause()
    try:
        with caplog.at_level(logging.INFO, logger="redis_tb"):
            statuses = [tc.get("/").status_code for _ in range(3)]
    finally:
        own_server.resume()
    assert statuses == [503, 503, 503] and len(records(caplog, logging.WARNING)) == 1
    with asgi_client(own_server, fail_open=False) as ac:
        assert ac.get("/").status_code == 200
        own_server.kill()
        r = ac.get("/")
        assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"


def test_plain_api_raises_own_error_fast(own_server):
    lim = RateLimiter(redis.Redis(port=own_server.port))
    assert lim.take("k", 5, 1).allowed
    own_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(LimiterUnavailable):
            lim.take("k", 5, 1)
        assert time.monotonic() - started < 1.0

        async def main():
            alim = AsyncRateLimiter(aredis.Redis(port=own_server.port))
            started = time.monotonic()
            with pytest.raises(LimiterUnavailable):
                await alim.take("k", 5, 1)
            assert time.monotonic() - started < 1.5

        asyncio.run(main())
    finally:
        own_server.resume()


@pytest.mark.parametrize("backend", ["module", "function"])
def test_a_take_that_timed_out_while_the_server_hung_is_still_charged_when_it_resumes(own_module_server, backend):
    """Documented (README, docs/clients.md: a timed-out call may still be
    charged; issue 18 item 16): the command was on the wire, so the server
    runs it when it resumes, although the caller got LimiterUnavailable."""
    limiter = RateLimiter(redis.Redis(port=own_module_server.port), backend=backend)
    slow = 0.000001  # nothing refills during the test
    assert limiter.take("charged:k", 5, slow).remaining == 4
    own_module_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(LimiterUnavailable):
            limiter.take("charged:k", 5, slow)
        assert time.monotonic() - started < 1.0
    finally:
        own_module_server.resume()
    # peek answers what a take of 1 would: 3 left if the timed-out take was not
    # charged, 2 once the server has run it.
    deadline = time.monotonic() + 5
    while limiter.peek("charged:k", 5, slow).remaining == 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert limiter.peek("charged:k", 5, slow).remaining == 2
    limiter.close()

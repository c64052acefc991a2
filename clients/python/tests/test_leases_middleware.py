"""In-flight limits in the ASGI and WSGI middleware (Concurrency), against
real servers: a request holds a lease until its response is finished,
others past the limit get 429 (or 503) with the concurrency headers, and
the lease is released on errors, and failing open with the server stopped."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import redis

from redis_tb import Concurrency, InvalidArgument, Policy, RateLimiter, bucket_key
from redis_tb.asgi import RateLimitMiddleware as AsgiLimit
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

from conftest import async_limiter

PROBLEM = "https://iana.org/assignments/http-problem-types#quota-exceeded"
POLICY = '"inflight";q=1;qu="concurrent-requests"'


def test_concurrency_is_checked_when_created():
    for bad in (dict(limit=0), dict(limit=1, lease_ms=0), dict(limit=1, status=500), dict(limit=1, name="")):
        with pytest.raises(InvalidArgument):
            Concurrency(**bad)
    lim = RateLimiter(redis.Redis(port=1))
    with pytest.raises(InvalidArgument):
        WsgiLimit(None, lim, Policy(1, 1, "x"), concurrency=Concurrency(1, name="x"))
    with pytest.raises(InvalidArgument):
        WsgiLimit(None, lim, None)


# --- ASGI: the middleware called as a server would call it -------------------


async def asgi_request(app, path="/"):
    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "client": ("10.0.0.1", 1234)}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    try:
        await app(scope, receive, send)
    except RuntimeError as e:
        return 0, {}, str(e).encode()
    start = sent[0]
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, body


def asgi_app(gate: asyncio.Event):
    async def app(scope, receive, send):
        if scope["path"] == "/fail":
            raise RuntimeError("the app failed")
        if scope["path"] == "/slow":
            await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"hello"})

    return app


@pytest.mark.parametrize("status", [429, 503])
def test_asgi_in_flight_limit(setup, status):
    server, arg, _ = setup

    async def main():
        async with async_limiter(server.port, arg) as (client, lim):
            gate = asyncio.Event()
            app = AsgiLimit(asgi_app(gate), lim, concurrency=Concurrency(1, 30_000, status=status))
            slow = asyncio.ensure_future(asgi_request(app, "/slow"))
            await asyncio.sleep(0.2)
            code, headers, body = await asgi_request(app)
            assert code == status
            assert headers["ratelimit-policy"] == POLICY and headers["retry-after"] == "30"
            assert headers["content-type"] == "application/problem+json"
            problem = json.loads(body)
            assert problem["type"] == PROBLEM and problem["status"] == status
            assert problem["violated-policies"] == ["inflight"] and "retry in 30 s" in problem["detail"]
            gate.set()
            code, headers, _ = await slow
            assert code == 200 and headers["ratelimit-policy"] == POLICY and "retry-after" not in headers
            # released when the response finished; also when the app raises
            code, _, _ = await asgi_request(app, "/fail")
            assert code == 0
            code, _, body = await asgi_request(app)
            assert code == 200 and body == b"hello"
            assert await client.zcard(bucket_key("ratelimit:", "10.0.0.1", "inflight")) == 2  # only `seq` and `inc`

    asyncio.run(main())


def test_asgi_with_a_rate_policy_too(setup):
    server, arg, _ = setup

    async def main():
        async with async_limiter(server.port, arg) as (client, lim):
            app = AsgiLimit(asgi_app(asyncio.Event()), lim, Policy(5, 0.001), concurrency=Concurrency(2))
            code, headers, _ = await asgi_request(app)
            assert code == 200
            assert headers["ratelimit-policy"] == '"default";q=5;w=5000, "inflight";q=2;qu="concurrent-requests"'
            assert headers["ratelimit"] == '"default";r=4;t=1000'

    asyncio.run(main())


@pytest.mark.parametrize("fail_open", [True, False])
def test_asgi_fails_open_or_closed_with_the_server_stopped(own_server, fail_open):
    async def main():
        async with async_limiter(own_server.port) as (client, lim):
            app = AsgiLimit(asgi_app(asyncio.Event()), lim, concurrency=Concurrency(1), fail_open=fail_open)
            assert (await asgi_request(app))[0] == 200
            own_server.kill()
            code, headers, _ = await asgi_request(app)
            assert (code, headers.get("ratelimit-policy")) == ((200, None) if fail_open else (503, None))
            assert app.outcomes.unavailable_count == 1

    asyncio.run(main())


# --- WSGI --------------------------------------------------------------------


def wsgi_app(gate: threading.Event):
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/fail":
            raise RuntimeError("the app failed")
        start_response("200 OK", [("Content-Type", "text/plain")])

        def body():
            if environ["PATH_INFO"] == "/slow":
                gate.wait(10)
            yield b"hello"

        return body()

    return app


def wsgi_request(app, path="/"):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "REMOTE_ADDR": "10.0.0.2"}
    started = {}

    def start_response(status, headers, exc_info=None):
        started["status"] = int(status.split()[0])
        started["headers"] = {k.lower(): v for k, v in headers}

    result = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        if hasattr(result, "close"):
            result.close()  # as a WSGI server does
    return started["status"], started["headers"], body


@pytest.mark.parametrize("status", [429, 503])
def test_wsgi_in_flight_limit(setup, status):
    server, arg, _ = setup
    client = redis.Redis(port=server.port)
    lim = RateLimiter(client, backend=arg)
    gate = threading.Event()
    app = WsgiLimit(wsgi_app(gate), lim, concurrency=Concurrency(1, 30_000, status=status))
    slow = []
    t = threading.Thread(target=lambda: slow.append(wsgi_request(app, "/slow")))
    t.start()
    try:
        for _ in range(50):  # until the slow request holds its lease
            if client.zcard(bucket_key("ratelimit:", "10.0.0.2", "inflight")) == 3:  # and `seq`, `inc`
                break
            threading.Event().wait(0.02)
        code, headers, body = wsgi_request(app)
        assert code == status and headers["ratelimit-policy"] == POLICY and headers["retry-after"] == "30"
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["violated-policies"] == ["inflight"]
    finally:
        gate.set()
        t.join(10)
    assert slow[0][0] == 200 and slow[0][1]["ratelimit-policy"] == POLICY
    with pytest.raises(RuntimeError):
        wsgi_request(app, "/fail")
    assert wsgi_request(app)[0] == 200  # released after the response and after the error
    assert client.zcard(bucket_key("ratelimit:", "10.0.0.2", "inflight")) == 2  # `seq`, `inc`
    lim.close()
    client.close()


@pytest.mark.parametrize("fail_open", [True, False])
def test_wsgi_fails_open_or_closed_with_the_server_stopped(own_server, fail_open):
    client = redis.Redis(port=own_server.port)
    lim = RateLimiter(client)
    app = WsgiLimit(wsgi_app(threading.Event()), lim, concurrency=Concurrency(1), fail_open=fail_open)
    assert wsgi_request(app)[0] == 200
    own_server.kill()
    code, headers, _ = wsgi_request(app)
    assert code == (200 if fail_open else 503) and "ratelimit-policy" not in headers
    lim.close()
    client.close()

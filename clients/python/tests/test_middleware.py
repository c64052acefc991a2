"""ASGI (Starlette TestClient, a real uvicorn) and WSGI (Flask test client, a
real wsgiref server) middleware against real servers."""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import socket
import threading
import time
from contextlib import contextmanager
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
import redis
import redis.asyncio as aredis
from flask import Flask
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from redis_tb import AsyncRateLimiter, Policy, RateLimiter
from redis_tb.asgi import RateLimitMiddleware as AsgiLimit
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

from test_api import SLOW

PROBLEM = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def starlette_app():
    async def hello(request):
        return PlainTextResponse("hello")

    return Starlette(routes=[Route("/", hello), Route("/other", hello)])


def flask_app():
    app = Flask(__name__)

    @app.route("/")
    def hello():
        return "hello"

    @app.route("/other")
    def other():
        return "hello"

    return app


def check_denied(resp, name="default"):
    assert resp.status_code == 429
    assert resp.headers["content-type"] == "application/problem+json"
    body = json.loads(resp.content)
    assert body["type"] == PROBLEM and body["title"] == "Too Many Requests" and body["status"] == 429
    assert body["violated-policies"] == [name] and body["detail"]
    return body


@contextmanager
def asgi_client(port, backend, policies, **kw):
    """A Starlette TestClient over the middleware."""
    lim = AsyncRateLimiter(aredis.Redis(port=port), backend=backend)
    with TestClient(AsgiLimit(starlette_app(), lim, policies, **kw)) as tc:
        yield tc


@contextmanager
def wsgi_client(port, backend, policies, **kw):
    """A Flask test client over the middleware."""
    lim = RateLimiter(redis.Redis(port=port), backend=backend)
    app = flask_app()
    app.wsgi_app = WsgiLimit(app.wsgi_app, lim, policies, **kw)
    yield app.test_client()
    lim.close()


@pytest.fixture
def asgi(setup):
    """asgi_client(policies, **kw) on each backend."""
    server, arg, _ = setup
    return functools.partial(asgi_client, server.port, arg)


@pytest.fixture
def wsgi(setup):
    """wsgi_client(policies, **kw) on each backend."""
    server, arg, _ = setup
    return functools.partial(wsgi_client, server.port, arg)


def test_asgi_headers_then_429(asgi):
    with asgi(Policy(2, SLOW)) as tc:
        r = tc.get("/")
        assert r.status_code == 200 and r.text == "hello"
        assert r.headers["ratelimit-policy"] == '"default";q=2;w=2000'
        assert r.headers["ratelimit"] == '"default";r=1;t=1000'
        assert "retry-after" not in r.headers
        assert tc.get("/").headers["ratelimit"] == '"default";r=0;t=2000'
        r = tc.get("/")
        check_denied(r)
        assert r.headers["retry-after"] == "1000" and r.headers["ratelimit"] == '"default";r=0;t=2000'


def test_wsgi_headers_then_429(wsgi):
    with wsgi(Policy(2, SLOW, "api")) as tc:
        r = tc.get("/")
        assert r.status_code == 200 and r.data == b"hello"
        assert r.headers["RateLimit-Policy"] == '"api";q=2;w=2000'
        assert r.headers["RateLimit"] == '"api";r=1;t=1000'
        tc.get("/")
        r = tc.get("/")
        assert r.status_code == 429 and r.headers["Content-Type"] == "application/problem+json"
        assert json.loads(r.data)["violated-policies"] == ["api"] and r.headers["Retry-After"] == "1000"


def test_asgi_key_per_user_and_route_and_cost(asgi):
    per_user_route = lambda scope: dict(scope["headers"]).get(b"x-user", b"anon").decode() + ":" + scope["path"]
    cost = lambda scope: 3 if scope["path"] == "/other" else 1
    with asgi(Policy(3, SLOW), key=per_user_route, cost=cost) as tc:
        assert tc.get("/", headers={"x-user": "ann"}).headers["ratelimit"] == '"default";r=2;t=1000'
        assert tc.get("/", headers={"x-user": "bob"}).headers["ratelimit"] == '"default";r=2;t=1000'
        assert tc.get("/other", headers={"x-user": "ann"}).headers["ratelimit"] == '"default";r=0;t=3000'
        check_denied(tc.get("/other", headers={"x-user": "ann"}))
        assert tc.get("/", headers={"x-user": "ann"}).status_code == 200


def test_wsgi_key_and_cost(wsgi):
    key = lambda environ: environ.get("HTTP_X_USER", "anon")
    with wsgi(Policy(4, SLOW), key=key, cost=lambda environ: 2) as tc:
        assert tc.get("/", headers={"X-User": "a"}).headers["RateLimit"] == '"default";r=2;t=2000'
        assert tc.get("/", headers={"X-User": "a"}).headers["RateLimit"] == '"default";r=0;t=4000'
        assert tc.get("/", headers={"X-User": "a"}).status_code == 429
        assert tc.get("/", headers={"X-User": "b"}).status_code == 200


def test_asgi_several_policies(asgi):
    with asgi([Policy(10, SLOW, "sec"), Policy(2, SLOW, "day")]) as tc:
        r = tc.get("/")
        assert r.headers["ratelimit-policy"] == '"sec";q=10;w=10000, "day";q=2;w=2000'
        assert r.headers["ratelimit"] == '"day";r=1;t=1000'
        tc.get("/")
        check_denied(tc.get("/"), "day")


def test_wsgi_several_policies_default_names(wsgi):
    with wsgi([Policy(1, SLOW), Policy(5, SLOW)]) as tc:
        r = tc.get("/")
        assert r.headers["RateLimit-Policy"] == '"limit0";q=1;w=1000, "limit1";q=5;w=5000'
        r = tc.get("/")
        assert r.status_code == 429 and json.loads(r.data)["violated-policies"] == ["limit0"]


def test_wsgi_django_style_call(setup):
    """The bare WSGI protocol as Django's handler is called: environ + start_response."""
    server, arg, _ = setup

    def django_like(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [b"ok"]

    app = WsgiLimit(django_like, RateLimiter(redis.Redis(port=server.port), backend=arg), Policy(1, SLOW))
    seen = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "10.0.0.9"}
    body = b"".join(app(dict(environ), lambda status, headers, exc=None: seen.append((status, dict(headers)))))
    assert body == b"ok" and seen[0][0] == "200 OK" and seen[0][1]["RateLimit"] == '"default";r=0;t=1000'
    body = b"".join(app(dict(environ), lambda status, headers, exc=None: seen.append((status, dict(headers)))))
    assert seen[1][0] == "429 Too Many Requests" and json.loads(body)["status"] == 429


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path="/"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_real_uvicorn_server(module_server):
    import uvicorn

    with module_server.client() as r:
        r.flushall()
    port = free_port()
    lim = AsyncRateLimiter(aredis.Redis(port=module_server.port))
    config = uvicorn.Config(AsgiLimit(starlette_app(), lim, Policy(1, SLOW)), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not srv.started and time.monotonic() < deadline:
            time.sleep(0.02)
        status, headers, body = http_get(port)
        assert status == 200 and body == b"hello" and headers["ratelimit"] == '"default";r=0;t=1000'
        status, headers, body = http_get(port)
        assert status == 429 and headers["content-type"] == "application/problem+json"
        assert headers["retry-after"] == "1000"
    finally:
        srv.should_exit = True
        thread.join(10)


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def wsgi_server(app):
    httpd = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_port
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_real_wsgi_server(plain_server):
    with plain_server.client() as r:
        r.flushall()
    app = flask_app()
    app.wsgi_app = WsgiLimit(app.wsgi_app, RateLimiter(redis.Redis(port=plain_server.port)), Policy(1, SLOW))
    with wsgi_server(app) as port:
        status, headers, _ = http_get(port)
        assert status == 200 and headers["ratelimit"] == '"default";r=0;t=1000'
        status, headers, body = http_get(port)
        assert status == 429 and json.loads(body)["violated-policies"] == ["default"]

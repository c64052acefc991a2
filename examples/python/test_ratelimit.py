"""ratelimit.py against a real redis-server with the redis-tb module."""

from __future__ import annotations

import http.client
import logging
import re
import threading
import time
from contextlib import contextmanager
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
import redis

from ratelimit import Decision, connect, make_app, take


# --- the header mapping, no server needed ---------------------------------

def test_headers_when_allowed():
    assert Decision(True, 19, 0, 200).headers(20, 5) == [
        ("RateLimit-Policy", "20;w=4"),
        ("RateLimit", "limit=20, remaining=19, reset=1"),
    ]


@pytest.mark.parametrize("retry_ms,header", [(1, "1"), (1000, "1"), (1001, "2"), (120_500, "121")])
def test_retry_after_rounds_up(retry_ms, header):
    h = dict(Decision(False, 0, retry_ms, 3999).headers(20, 5))
    assert h["Retry-After"] == header
    assert h["RateLimit"] == "limit=20, remaining=0, reset=4"


def test_no_retry_after_when_it_can_never_succeed():
    d = Decision(False, 20, -1, 0)
    assert d.can_never_succeed and d.retry_after is None
    assert "Retry-After" not in dict(d.headers(20, 5))


def test_policy_window_and_fractional_capacity():
    d = Decision(True, 1, 0, 500)
    assert dict(d.headers(10, 3))["RateLimit-Policy"] == "10;w=4"
    assert dict(d.headers(5, 1000))["RateLimit-Policy"] == "5;w=1"
    assert dict(d.headers(2.5, 1))["RateLimit-Policy"] == "2;w=3"


# --- take() against the server ---------------------------------------------

@pytest.fixture
def r(server):
    client = connect(server.url, timeout=2)
    client.flushall()
    yield client
    client.close()


def test_burst_then_denial(r):
    for expected in (4, 3, 2, 1, 0):
        d = take(r, "rl:burst", 5, 1)
        assert d.allowed and d.remaining == expected and d.retry_after_ms == 0, d
    d = take(r, "rl:burst", 5, 1)
    assert not d.allowed and d.remaining == 0, d
    assert 0 < d.retry_after_ms <= 1000 and 4000 < d.reset_after_ms <= 5000, d
    h = dict(d.headers(5, 1))
    assert h == {
        "RateLimit-Policy": "5;w=5",
        "RateLimit": "limit=5, remaining=0, reset=5",
        "Retry-After": "1",
    }
    assert r.type("rl:burst") == b"hash"
    assert 0 < r.pttl("rl:burst") <= 5000


def test_waiting_retry_after_is_enough(r):
    # One token every 50 ms.
    assert take(r, "rl:retry", 2, 20).allowed
    assert take(r, "rl:retry", 2, 20).allowed
    d = take(r, "rl:retry", 2, 20)
    assert not d.allowed and 0 < d.retry_after <= 0.05, d
    time.sleep(d.retry_after)
    assert take(r, "rl:retry", 2, 20).allowed


def test_cost_above_capacity(r):
    d = take(r, "rl:big", 5, 1, n=6)
    assert d == Decision(False, 5, -1, 0)
    assert not r.exists("rl:big")


def test_argument_errors_raise(r):
    with pytest.raises(redis.ResponseError, match="rate must be a positive finite number"):
        take(r, "rl:err", 5, 0)
    with pytest.raises(redis.ResponseError, match="capacity must be a positive finite number"):
        take(r, "rl:err", float("nan"), 1)


# --- the WSGI example over HTTP --------------------------------------------

class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(app):
    httpd = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_port
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def get(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_wsgi_app_limits_then_fails_open(own_server, caplog):
    with connect(own_server.url) as r, serve(make_app(r, capacity=3, rate=0.5)) as port:
        statuses = []
        for _ in range(3):
            status, headers, body = get(port)
            statuses.append(status)
            assert body == b"hello\n" and "Retry-After" not in headers
        assert statuses == [200, 200, 200]
        assert headers["RateLimit"] == "limit=3, remaining=0, reset=6"
        assert headers["RateLimit-Policy"] == "3;w=6"

        status, headers, body = get(port)
        assert status == 429 and body == b"rate limit exceeded\n"
        assert headers["Retry-After"] == "2"

        def expect_fail_open():
            for _ in range(3):
                started = time.monotonic()
                status, headers, body = get(port)
                assert status == 200 and body == b"hello\n"
                assert "RateLimit" not in headers
                assert time.monotonic() - started < 2

        with caplog.at_level(logging.WARNING, logger="ratelimit"):
            # Redis hangs: each request waits for the socket timeout, then goes through.
            own_server.pause()
            try:
                expect_fail_open()
            finally:
                own_server.resume()
            assert "failing open: Timeout" in caplog.text
            caplog.clear()

            # Redis goes away: requests still get through, promptly.
            own_server.stop()
            expect_fail_open()
            assert re.search(r"failing open: Error \d+ connecting", caplog.text), caplog.text

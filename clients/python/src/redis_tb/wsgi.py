"""WSGI middleware (Flask, Django, any WSGI app) on a RateLimiter."""

from __future__ import annotations

from time import perf_counter

from . import _middleware as mw
from ._core import LeaseDenied, LimiterError, bucket_key
from .limiter import RateLimiter


def client_ip(environ) -> str:
    """The default key: REMOTE_ADDR, ``::ffff:a.b.c.d`` as ``a.b.c.d``
    (behind a proxy, use the proxy's forwarded header in a key function of
    your own)."""
    return mw.peer_id(environ.get("REMOTE_ADDR"))


_STATUS = {429: "429 Too Many Requests", 500: "500 Internal Server Error", 503: "503 Service Unavailable"}


class RateLimitMiddleware(mw.Middleware[RateLimiter]):
    """Rate-limits requests of a WSGI app; the options are those of
    `redis_tb.asgi.RateLimitMiddleware`, with `key(environ)`,
    `cost(environ)` and `on_error(error, environ) -> WSGI app`.

    With `concurrency`, the lease is released when the server closes the
    response iterable (PEP 3333 ``close()``: after the last chunk, or when
    the client went away), or at once if the app raises.

    Flask: ``app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, Policy(10, 1))``
    Django: wrap ``get_wsgi_application()`` in wsgi.py the same way.
    """

    default_key = staticmethod(client_ip)

    def _decide(self, environ, identity):
        if not self.policies:
            return None
        n = self.cost if not callable(self.cost) else self.cost(environ)
        n = 1 if n is None else n
        limits = mw.limits_for(self.prefix, identity, self.policies, n)
        if len(limits) == 1:
            lim = limits[0]
            return self.limiter.take(lim.key, lim.capacity, lim.rate, lim.n, policy=lim.policy)
        return self.limiter.take_all(limits)

    def __call__(self, environ, start_response):
        guard = d = None
        started, leasing = perf_counter(), False
        try:
            identity = str(self.key(environ))
            if self.concurrency is not None:  # in flight first: a refused request spends no token
                c = self.concurrency
                guard = self.limiter.lease(bucket_key(self.prefix, identity, c.name), c.limit, c.lease_ms, policy=c.name)
                leasing = True
                try:
                    guard.__enter__()
                except LeaseDenied as e:
                    self.outcomes.succeeded()
                    headers = mw.lease_denied_headers(self.policies, c, e.decision)
                    return _respond(start_response, c.status, headers, mw.lease_denied_body(e.decision, c.status))
            leasing = False
            try:
                d = self._decide(environ, identity)
            except BaseException:
                _release(guard)
                raise
            if d is not None and not d.allowed:
                self.outcomes.succeeded()
                _release(guard)
                headers = mw.merged_headers(d, guard.decision if guard is not None else None)
                return _respond(start_response, 429, headers, mw.denied_body(d))
        except LimiterError as e:
            outcome = self.outcomes.failed(e)
            if outcome != mw.ERROR:
                self.unavailable(outcome, leasing, started)
            if outcome == mw.FAIL_OPEN:
                return self.app(environ, start_response)
            if outcome == mw.FAIL_CLOSED:
                return _respond(start_response, 503, [], mw.unavailable_body())
            if self.on_error is not None:
                return self.on_error(e, environ)(environ, start_response)
            return _respond(start_response, 500, [], mw.error_body())
        self.outcomes.succeeded()
        headers = mw.merged_headers(d, guard.decision if guard is not None else None)

        def start_with_headers(status, response_headers, exc_info=None):
            return start_response(status, list(response_headers) + headers, exc_info)

        if guard is None:
            return self.app(environ, start_with_headers)
        try:
            body = self.app(environ, start_with_headers)
        except BaseException:
            _release(guard)
            raise
        return _Releasing(body, guard)


def _release(guard):
    """Give the request's lease back (if it holds one); a failure is logged."""
    if guard is None:
        return
    try:
        guard.release()
    except LimiterError as e:
        mw.release_failed(e)


class _Releasing:
    """The app's response iterable, releasing the request's lease when the
    server closes it (PEP 3333), once."""

    def __init__(self, body, guard):
        self._body = body
        self._guard = guard

    def __iter__(self):
        return iter(self._body)

    def close(self):
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            _release(self._guard)


def _respond(start_response, status, headers, body: bytes):
    start_response(
        _STATUS[status],
        list(headers) + [("Content-Type", mw.PROBLEM_JSON), ("Content-Length", str(len(body)))],
    )
    return [body]


__all__ = ["RateLimitMiddleware", "client_ip"]

"""ASGI middleware (Starlette, FastAPI, any ASGI app) on an AsyncRateLimiter."""

from __future__ import annotations

import inspect
from time import perf_counter

from . import _middleware as mw
from ._core import LeaseDenied, LimiterError, bucket_key
from .aio import AsyncRateLimiter


def client_ip(scope) -> str:
    """The default key: the peer address ASGI reports, ``::ffff:a.b.c.d``
    as ``a.b.c.d`` (behind a proxy, use the proxy's forwarded header in a
    key function of your own)."""
    client = scope.get("client")
    return mw.peer_id(client[0] if client else None)


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


class RateLimitMiddleware(mw.Middleware[AsyncRateLimiter]):
    """Rate-limits HTTP requests of an ASGI app.

    policies: a `Policy` (one bucket per key) or a list (all at once, via
        take_all; the tightest decides); None with `concurrency` only.
    concurrency: a `Concurrency`: at most `limit` requests of one key in
        flight. A lease is acquired when the request starts, before the
        rate limit (a request refused for concurrency spends no token; a
        rate denial gives its lease back), renewed while it runs and
        released when the app returns: the response finished, failed or
        the client went away. Denied: 429 (or the Concurrency's status,
        503) with the one ``RateLimit-Policy`` line and ``Retry-After``.
        An unavailable limiter lets the request through without a lease
        ("open" and "local"), or answers 503 ("closed").
    key(scope) -> str: whose bucket (default, or None: `client_ip`); may be async.
    cost: tokens per request: a number (checked now) or cost(scope) -> number,
        which may be async (default 1).
    prefix: prepended to bucket keys (`<prefix>{<key>}:<policy name>`).
    on_unavailable: when Redis is unreachable (docs/clients.md#the-failure-rule):
        "open" (default) lets requests through without headers, "closed"
        answers 503, "local" lets the limiter's local limiter decide (the
        limiter must be made with on_unavailable="local").
    fail_open: the older spelling: True is "open", False "closed".
    on_error(error, scope) -> ASGI app: what answers a request when the
        limiter fails with a bug (WRONGTYPE, a bad cost, ...), which is
        never let through silently; default: a 500 problem+json. The error
        is logged at ERROR level every time either way.

    `outcomes.unavailable_count` and `outcomes.error_count` count the
    requests that met each.
    """

    default_key = staticmethod(client_ip)

    async def _decide(self, scope, identity):
        if not self.policies:
            return None
        n = self.cost if not callable(self.cost) else await _maybe_await(self.cost(scope))
        n = 1 if n is None else n
        limits = mw.limits_for(self.prefix, identity, self.policies, n)
        if len(limits) == 1:
            lim = limits[0]
            return await self.limiter.take(lim.key, lim.capacity, lim.rate, lim.n, policy=lim.policy)
        return await self.limiter.take_all(limits)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        guard = d = None
        started, leasing = perf_counter(), False
        try:
            identity = str(await _maybe_await(self.key(scope)))
            if self.concurrency is not None:  # in flight first: a refused request spends no token
                c = self.concurrency
                guard = self.limiter.lease(bucket_key(self.prefix, identity, c.name), c.limit, c.lease_ms, policy=c.name)
                leasing = True
                try:
                    await guard.__aenter__()
                except LeaseDenied as e:
                    self.outcomes.succeeded()
                    headers = mw.lease_denied_headers(self.policies, c, e.decision)
                    return await _respond(send, c.status, headers, mw.lease_denied_body(e.decision, c.status))
            leasing = False
            try:
                d = await self._decide(scope, identity)
            except BaseException:
                await _release(guard)
                raise
            if d is not None and not d.allowed:
                self.outcomes.succeeded()
                await _release(guard)
                headers = mw.merged_headers(d, guard.decision if guard is not None else None)
                return await _respond(send, 429, headers, mw.denied_body(d))
        except LimiterError as e:
            outcome = self.outcomes.failed(e)
            if outcome != mw.ERROR:
                self.unavailable(outcome, leasing, started)
            if outcome == mw.FAIL_OPEN:
                return await self.app(scope, receive, send)
            if outcome == mw.FAIL_CLOSED:
                return await _respond(send, 503, [], mw.unavailable_body())
            if self.on_error is not None:
                answer = await _maybe_await(self.on_error(e, scope))
                return await answer(scope, receive, send)
            return await _respond(send, 500, [], mw.error_body())
        self.outcomes.succeeded()
        headers = mw.merged_headers(d, guard.decision if guard is not None else None)
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + raw
            await send(message)

        try:
            return await self.app(scope, receive, send_with_headers)
        finally:
            await _release(guard)


async def _release(guard):
    """Give the request's lease back (if it holds one); a failure is logged."""
    if guard is None:
        return
    try:
        await guard.release()
    except LimiterError as e:
        mw.release_failed(e)


async def _respond(send, status, headers, body: bytes):
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    raw += [(b"content-type", mw.PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


__all__ = ["RateLimitMiddleware", "client_ip"]

"""ASGI middleware (Starlette, FastAPI, any ASGI app) on an AsyncRateLimiter."""

from __future__ import annotations

import inspect
from . import _middleware as mw
from ._core import LeaseDenied, LimiterError, bucket_key
from .aio import AsyncRateLimiter


def client_ip(scope) -> str:
    """The default key: the peer address ASGI reports (behind a proxy, use
    the proxy's forwarded header in a key function of your own)."""
    client = scope.get("client")
    return client[0] if client else "unknown"


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


class RateLimitMiddleware(mw.Middleware[AsyncRateLimiter]):
    """Rate-limits HTTP requests of an ASGI app.

    policies: a `Policy` (one bucket per key) or a list (all at once, via
        take_all; the tightest decides); None with `concurrency` only.
    concurrency: a `Concurrency`: at most `limit` requests of one key in
        flight. A lease is acquired when the request starts (after the rate
        limit, if any, allowed it), renewed while it runs and released when
        the app returns: the response finished, failed or the client went
        away. Denied: 429 (or the Concurrency's status, 503) with
        ``RateLimit-Policy: "<name>";q=<limit>;qu="concurrent-requests"``
        and ``Retry-After``. `fail_open` applies: an unavailable limiter
        lets the request through without a lease, or answers 503.
    key(scope) -> str: whose bucket (default, or None: `client_ip`); may be async.
    cost: tokens per request: a number (checked now) or cost(scope) -> number,
        which may be async (default 1).
    prefix: prepended to bucket keys (`<prefix>{<key>}:<policy name>`).
    fail_open: when the limiter is unavailable (docs/clients.md#the-failure-rule),
        True (default) lets requests through without headers, False answers 503.
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
        guard = None
        try:
            identity = str(await _maybe_await(self.key(scope)))
            d = await self._decide(scope, identity)
            if d is not None and not d.allowed:
                self.outcomes.ok()
                return await _respond(send, 429, mw.header_list(d), mw.denied_body(d))
            if self.concurrency is not None:
                c = self.concurrency
                guard = self.limiter.lease(bucket_key(self.prefix, identity, c.name), c.limit, c.lease_ms, policy=c.name)
                try:
                    await guard.__aenter__()
                except LeaseDenied as e:
                    self.outcomes.ok()
                    headers = mw.merged_headers(d, e.decision)
                    return await _respond(send, c.status, headers, mw.lease_denied_body(e.decision, c.status))
        except LimiterError as e:
            outcome = self.outcomes.failed(e)
            if outcome == mw.FAIL_OPEN:
                return await self.app(scope, receive, send)
            if outcome == mw.FAIL_CLOSED:
                return await _respond(send, 503, [], mw.unavailable_body())
            if self.on_error is not None:
                answer = await _maybe_await(self.on_error(e, scope))
                return await answer(scope, receive, send)
            return await _respond(send, 500, [], mw.error_body())
        self.outcomes.ok()
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
            if guard is not None:
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

"""ASGI middleware (Starlette, FastAPI, any ASGI app) on an AsyncRateLimiter."""

from __future__ import annotations

import inspect
from typing import Sequence, Union

from . import _middleware as mw
from ._core import LimiterError, Policy
from .aio import AsyncRateLimiter


def client_ip(scope) -> str:
    """The default key: the peer address ASGI reports (behind a proxy, use
    the proxy's forwarded header in a key function of your own)."""
    client = scope.get("client")
    return client[0] if client else "unknown"


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


class RateLimitMiddleware:
    """Rate-limits HTTP requests of an ASGI app.

    policies: a `Policy` (one bucket per key) or a list (all at once, via
        take_all; the tightest decides).
    key(scope) -> str: whose bucket (default: client IP); may be async.
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

    def __init__(
        self,
        app,
        limiter: AsyncRateLimiter,
        policies: Union[Policy, Sequence[Policy]],
        *,
        key=client_ip,
        cost=None,
        prefix: str = "ratelimit:",
        fail_open: bool = True,
        on_error=None,
    ):
        self.app = app
        self.limiter = limiter
        self.policies = mw.policies(policies)
        self.key = key
        self.cost = mw.check_cost(cost)
        self.prefix = prefix
        self.on_error = on_error
        self.outcomes = mw.Outcomes(fail_open)

    async def _decide(self, scope):
        identity = str(await _maybe_await(self.key(scope)))
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
        try:
            d = await self._decide(scope)
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
        headers = mw.header_list(d)
        if not d.allowed:
            return await _respond(send, 429, headers, mw.denied_body(d))
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + raw
            await send(message)

        return await self.app(scope, receive, send_with_headers)


async def _respond(send, status, headers, body: bytes):
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    raw += [(b"content-type", mw.PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


__all__ = ["RateLimitMiddleware", "client_ip"]

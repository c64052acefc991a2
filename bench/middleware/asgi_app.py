"""The Starlette app of bench/middleware_bench.py, served by uvicorn.

The same four routes in every framework's app, each a Starlette app of its
own under a Mount, so that they differ only by the GET or the middleware:
  GET /bare/x    "ok", no middleware
  GET /get/x     one plain GET of bench:get on the same Redis, then "ok"
  GET /module/x  "ok" behind redis_tb.asgi.RateLimitMiddleware, module backend
  GET /lua/x     the same on the Lua backend (FUNCTION library)
The policy never denies (capacity and rate 1e9): the allow path, the one every
request of a healthy service takes. Env: REDIS_URL.
"""

import os

import redis.asyncio
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from redis_tb import AsyncRateLimiter, Policy
from redis_tb.asgi import RateLimitMiddleware

client = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
POLICY = Policy(capacity=1e9, rate=1e9)


async def ok(request):
    return PlainTextResponse("ok")


async def one_get(request):
    await client.get("bench:get")
    return PlainTextResponse("ok")


def sub(handler):
    return Starlette(routes=[Route("/x", handler)])


def limited(backend):
    return RateLimitMiddleware(sub(ok), limiter=AsyncRateLimiter(client, backend=backend), policies=POLICY)


app = Starlette(
    routes=[
        Mount("/bare", app=sub(ok)),
        Mount("/get", app=sub(one_get)),
        Mount("/module", app=limited("module")),
        Mount("/lua", app=limited("function")),
    ]
)

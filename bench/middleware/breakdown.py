"""Where the Python middleware's time goes, without HTTP: run by
bench/middleware_bench.py in its venv, against the same Redis.

  python breakdown.py PORT N ROUNDS   -> one JSON object on stdout

Per call, in µs (median over ROUNDS of the mean of N sequential calls; the
calls take turns, N each, so a slow spell hits them alike):
  sync:  client.get, limiter.take, the WSGI middleware around an app that
         does nothing (called directly: take, key, headers, start_response)
  async: await client.get, the same inside asyncio.timeout (as the limiter
         bounds each command) and inside asyncio.wait_for (as it did before),
         await limiter.take, the ASGI middleware
  cpu:   bucket_key() and Decision.headers(), no I/O
  profile: the top functions (own time) of cProfile over the WSGI middleware
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import redis
import redis.asyncio

from redis_tb import AsyncRateLimiter, Policy, RateLimiter, bucket_key
from redis_tb import asgi as tb_asgi
from redis_tb import wsgi as tb_wsgi

PORT, N, ROUNDS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
POLICY = Policy(capacity=1e9, rate=1e9)
ENVIRON = {"REQUEST_METHOD": "GET", "PATH_INFO": "/x", "REMOTE_ADDR": "127.0.0.1"}


def timed(fns: dict) -> dict:
    """µs per call of each function; they take turns, N calls each, ROUNDS times."""
    means = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(N):
                fn()
            means[name].append((time.perf_counter() - t0) / N * 1e6)
    return {name: statistics.median(xs) for name, xs in means.items()}


async def atimed(fns: dict) -> dict:
    means = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(N):
                await fn()
            means[name].append((time.perf_counter() - t0) / N * 1e6)
    return {name: statistics.median(xs) for name, xs in means.items()}


def noop_wsgi(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def start_response(status, headers, exc_info=None):
    return None


def sync_part() -> tuple[dict, list]:
    client = redis.Redis(port=PORT)
    limiter = RateLimiter(client)
    mw = tb_wsgi.RateLimitMiddleware(noop_wsgi, limiter, POLICY)
    client.get("bench:get")
    d = limiter.take("ratelimit:{127.0.0.1}:default", 1e9, 1e9)
    assert limiter.backend == "module", limiter.backend

    def through_mw():
        for _ in mw(dict(ENVIRON), start_response):
            pass

    out = timed({
        "get": lambda: client.get("bench:get"),
        "take": lambda: limiter.take("ratelimit:{127.0.0.1}:default", 1e9, 1e9),
        "middleware": through_mw,
    })  # fmt: skip
    cpu = timed({"bucket_key": lambda: bucket_key("ratelimit:", "127.0.0.1", "default"), "headers": d.headers})
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(N):
        through_mw()
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    rows = []
    for (file, line, func), (cc, nc, tt, ct, callers) in stats.stats.items():
        where = "/".join(file.split("/")[-2:])
        rows.append({"function": f"{where}:{line}({func})", "own_us_per_request": round(tt / N * 1e6, 2),
                     "calls_per_request": round(nc / N, 2)})  # fmt: skip
    rows.sort(key=lambda r: -r["own_us_per_request"])
    limiter.close()
    return {**out, **{f"cpu_{k}": v for k, v in cpu.items()}}, rows[:12]


async def async_part() -> dict:
    client = redis.asyncio.Redis(port=PORT)
    limiter = AsyncRateLimiter(client)

    async def noop_asgi(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = tb_asgi.RateLimitMiddleware(noop_asgi, limiter=limiter, policies=POLICY)
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [], "client": ("127.0.0.1", 1)}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        return None

    async def through_mw():
        await mw(dict(scope), receive, send)

    async def get_within(seconds):
        async with asyncio.timeout(seconds):
            return await client.get("bench:get")

    await client.get("bench:get")
    await limiter.take("ratelimit:{127.0.0.1}:default", 1e9, 1e9)
    assert limiter.backend == "module", limiter.backend
    out = await atimed({
        "get": lambda: client.get("bench:get"),
        # How AsyncRateLimiter bounds every command: asyncio.timeout (3.11+), in
        # the calling task; wait_for (before 3.11, and what it used before): a task per call.
        "get_timeout": lambda: get_within(0.2),
        "get_wait_for": lambda: asyncio.wait_for(client.get("bench:get"), 0.2),
        "take": lambda: limiter.take("ratelimit:{127.0.0.1}:default", 1e9, 1e9),
        "middleware": through_mw,
    })  # fmt: skip
    await limiter.close()
    await client.aclose()
    return out


def main():
    sync, profile = sync_part()
    try:  # uvicorn runs on uvloop in the bench
        import uvloop

        aio = uvloop.run(async_part())
    except ImportError:
        aio = asyncio.run(async_part())
    print(json.dumps({"sync": sync, "async": aio, "profile_wsgi": profile}))


main()

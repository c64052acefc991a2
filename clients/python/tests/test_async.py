"""AsyncRateLimiter on redis.asyncio, every backend: the same answers as the sync API."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aredis

from redis_tb import AsyncRateLimiter, InvalidArgument, Limit, LimiterReplyError, RateLimiter

from conftest import aclose
from test_api import SLOW, scenario


def run(coro):
    return asyncio.run(coro)


def test_async_matches_sync(setup):
    server, arg, expected = setup

    class SyncFacade:
        """scenario() drives the async limiter through a sync facade."""

        def __init__(self, lim, loop):
            self.lim, self.loop = lim, loop

        def __getattr__(self, name):
            method = getattr(self.lim, name)
            return lambda *a, **k: self.loop.run_until_complete(method(*a, **k))

    loop = asyncio.new_event_loop()
    try:
        client = aredis.Redis(port=server.port)
        lim = AsyncRateLimiter(client, backend=arg)
        assert loop.run_until_complete(lim.connect()) == expected and lim.backend == expected
        got = scenario(SyncFacade(lim, loop))
        loop.run_until_complete(aclose(client))
    finally:
        loop.close()
    with server.client() as r:
        r.flushall()
    with RateLimiter(redis.Redis(port=server.port), backend=arg) as lim:
        assert scenario(lim) == got


def test_async_errors_and_wait_take(setup):
    server, arg, expected = setup

    async def main():
        client = aredis.Redis(port=server.port)
        lim = AsyncRateLimiter(client, backend=arg)
        with pytest.raises(InvalidArgument, match="^rate must be a positive finite number"):
            await lim.take("a:e", 5, 0)
        await client.set("a:str", "x")
        with pytest.raises(LimiterReplyError, match="^WRONGTYPE"):
            await lim.take("a:str", 5, 1)
        d = await lim.take_all([Limit("{a}x", 2, SLOW), Limit("{a}y", 1, SLOW, policy="one")])
        assert d.allowed and d.index == 1 and d.policy == "one"
        # a bucket refilling at 20/s: drained, then a waiter is served within ~50 ms
        assert (await lim.take("a:w", 1, 20)).allowed
        started = time.monotonic()
        d = await lim.wait_take("a:w", 1, 20, timeout_ms=3000)
        assert d.allowed and time.monotonic() - started < 1.5
        # times out with a denial
        await lim.take("a:slow", 1, SLOW)
        started = time.monotonic()
        d = await lim.wait_take("a:slow", 1, SLOW, timeout_ms=300)
        took = time.monotonic() - started
        assert not d.allowed and d.retry_after_ms > 0 and 0.25 < took < 2.5
        # can never succeed: at once
        d = await lim.wait_take("a:slow", 1, SLOW, 2, timeout_ms=5000)
        assert not d.allowed and d.retry_after_ms == -1
        await aclose(client)

    run(main())

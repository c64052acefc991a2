"""Redis going away under the limiter, against real servers: a dropped
connection is sent again once (not a refund, not after a timeout), the
local limiter limits while Redis is down and steps aside when it is back,
and the denial cache spares Redis a flood by one id (counted with INFO
commandstats). docs/clients.md#when-redis-is-down-the-local-limiter."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from redis_tb import AsyncRateLimiter, Limit, LimiterUnavailable, Policy, RateLimiter
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

from conftest import aclose
from test_api import SLOW
from test_leases_middleware import wsgi_app, wsgi_request

REACHABLE = "redis-tb: Redis reachable again; limits come from Redis"


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "redis_tb" and r.levelno == logging.WARNING]


# --- a dropped connection is not an outage -----------------------------------


def test_the_first_call_after_a_restart_succeeds(own_module_server):
    server = own_module_server
    with RateLimiter(redis.Redis(port=server.port)) as lim:
        assert lim.take("r:k", 10, SLOW).remaining == 9
        server.restart(module=True)
        d = lim.take("r:k", 10, SLOW)
        assert (d.allowed, d.remaining, d.source) == (True, 9, "server")  # a new, empty server


def test_the_first_async_call_after_a_restart_succeeds(own_module_server):
    server = own_module_server

    async def main():
        client = aredis.Redis(port=server.port)
        async with AsyncRateLimiter(client) as lim:
            assert (await lim.take("r:a", 10, SLOW)).remaining == 9
            server.restart(module=True)
            d = await lim.take("r:a", 10, SLOW)
            assert (d.allowed, d.remaining, d.source) == (True, 9, "server")
        await aclose(client)

    asyncio.run(main())


class Dropper:
    """A TCP relay to the server that, armed with a command name, closes the
    client's connection when that command arrives, before the server sees
    it: a connection that drops after the call was written, which the
    pool's check before sending cannot notice (a restart can)."""

    def __init__(self, port):
        self.target, self.armed = port, None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src, dst, from_client):
        try:
            while data := src.recv(65536):
                if from_client and self.armed and self.armed.encode() in data.upper():
                    self.armed = None
                    for s in (src, dst):
                        s.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def close(self):
        self.listener.close()


@pytest.fixture
def dropper(module_server):
    relay = Dropper(module_server.port)
    yield relay
    relay.close()


def test_a_take_is_sent_again_after_its_connection_dropped_and_a_refund_is_not(dropper, module_server):
    with RateLimiter(redis.Redis(port=dropper.port)) as lim:
        limit = Limit("r:drop", 10, SLOW, 5)
        module_server.client().delete("r:drop")
        assert lim.take_limit(limit).remaining == 5
        dropper.armed = "TB.TAKE"
        assert lim.take_limit(limit).remaining == 0  # sent again: the first copy never arrived
        for refund in (lambda: lim.refund("r:drop", 10, SLOW, 1), lambda: lim.settle(limit, 5, 1)):
            dropper.armed = "TB.REFUND"
            with pytest.raises(LimiterUnavailable):
                refund()
        assert lim.charge(limit, 1).remaining == 0 and dropper.armed is None
        dropper.armed = "TB.CHARGE"
        assert lim.charge(limit, 1).wait_ms > 0  # a charge is sent again


def test_an_async_take_is_sent_again_after_its_connection_dropped_and_a_refund_is_not(dropper, module_server):
    async def main():
        client = aredis.Redis(port=dropper.port)
        async with AsyncRateLimiter(client) as lim:
            module_server.client().delete("r:adrop")
            assert (await lim.take("r:adrop", 10, SLOW, 5)).remaining == 5
            dropper.armed = "TB.TAKE"
            assert (await lim.take("r:adrop", 10, SLOW, 5)).remaining == 0
            dropper.armed = "TB.REFUND"
            with pytest.raises(LimiterUnavailable):
                await lim.refund("r:adrop", 10, SLOW, 1)
        await aclose(client)

    asyncio.run(main())


def test_a_timeout_is_not_retried(own_module_server):
    server = own_module_server
    with RateLimiter(redis.Redis(port=server.port), timeout=1) as lim:
        assert lim.take("r:t", 10, SLOW).allowed
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(LimiterUnavailable):
                lim.take("r:t", 10, SLOW)
            assert time.monotonic() - started < 1.9  # one timeout, not two
        finally:
            server.resume()


# --- the local limiter -------------------------------------------------------




@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_with_the_server_stopped_each_instance_limits_at_its_share_then_redis_again(own_module_server, caplog,
                                                                                   asynchronous):
    server = own_module_server
    capacity, rate = 40, 1.0  # 20 each for instances=2, and one token a second for the two
    options = dict(on_unavailable="local", instances=2, local_probe_ms=200)

    async def takes(lim, count):
        out = []
        for _ in range(count):
            d = lim.take("o:user", capacity, rate)
            out.append(await d if asynchronous else d)
        return out

    async def main(lim):
        first = await takes(lim, 10)
        assert all(d.allowed and d.source == "server" for d in first)
        server.kill()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="redis_tb"):
            down = await takes(lim, 100)
            elapsed = time.monotonic() - started
            assert {d.source for d in down} == {"local"}
            allowed = sum(d.allowed for d in down)
            assert capacity / 2 <= allowed <= capacity / 2 + math.ceil(elapsed * rate / 2) + 1
            assert down[-1].retry_after_ms > 0 and not down[-1].allowed
            [start] = warnings(caplog)
            assert start.startswith("redis-tb: Redis unreachable (") and start.endswith(
                "); limiting in process at 1/2 of each limit")
            server.start(module=True)  # the same port, a new, empty server
            deadline = time.monotonic() + 5
            while True:
                d = (await takes(lim, 1))[0]
                if d.source == "server" or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert (d.source, d.remaining) == ("server", capacity - 1)
            assert warnings(caplog) == [start, REACHABLE]

    if asynchronous:
        async def run():
            client = aredis.Redis(port=server.port)
            async with AsyncRateLimiter(client, **options) as lim:
                await main(lim)
            await aclose(client)

        asyncio.run(run())
    else:
        with RateLimiter(redis.Redis(port=server.port), **options) as lim:
            asyncio.run(main(lim))





def test_take_all_and_peek_are_local_and_the_rest_raises_during_an_outage(own_module_server):
    server = own_module_server
    with RateLimiter(redis.Redis(port=server.port), on_unavailable="local") as lim:
        assert lim.take("o:x", 2, SLOW).source == "server"
        server.kill()
        limits = [Limit("o:{u}:a", 2, SLOW, 1, "a"), Limit("o:{u}:b", 1, SLOW, 1, "b")]
        assert lim.take_all(limits).source == "local"
        d = lim.take_all(limits)
        assert (d.allowed, d.index, d.policy, d.source) == (False, 1, "b", "local")
        peeked = lim.peek("o:{u}:a", 2, SLOW)  # a take would leave 0, and takes nothing:
        assert (peeked.allowed, peeked.remaining) == (True, 0) and lim.peek("o:{u}:a", 2, SLOW).allowed
        for call in (lambda: lim.refund("o:x", 2, SLOW, 1), lambda: lim.charge(limits[0], 1),
                     lambda: lim.unblock("o:x"), lambda: lim.wait_take("o:x", 2, SLOW, timeout_ms=10),
                     lambda: lim.acquire("o:l", 1, 1000)):
            with pytest.raises(LimiterUnavailable):
                call()
        assert lim.acquire("o:l", 1, 1000, fail_open=True).failed_open


def test_the_middleware_limits_locally_with_the_server_stopped(own_module_server):
    server = own_module_server
    with RateLimiter(redis.Redis(port=server.port), on_unavailable="local", instances=2) as lim:
        app = WsgiLimit(wsgi_app(threading.Event()), lim, Policy(4, SLOW), on_unavailable="local")
        assert wsgi_request(app)[0] == 200
        server.kill()
        codes = [wsgi_request(app)[0] for _ in range(5)]
        assert codes == [200, 200, 429, 429, 429]
        assert app.outcomes.unavailable_count == 0  # answered, not failed


# --- the denial cache --------------------------------------------------------

COUNTED = {"module": "cmdstat_tb.take", "function": "cmdstat_fcall", "script": "cmdstat_evalsha"}


def calls(client, backend) -> int:
    return client.info("commandstats").get(COUNTED[backend], {}).get("calls", 0)


def test_a_flood_by_one_id_reaches_the_server_once_per_retry_window(setup):
    server, arg, backend = setup
    client = server.client()
    with RateLimiter(redis.Redis(port=server.port), backend=arg, cache_denials=True) as lim:
        # A token, so one take, every 100 ms. The edges fall on whole ms,
        # where the server's doubles may bring the n-th token back a ms
        # after the reply says: the remembered wait has one ms more for it
        # (without it this flood cost up to twice the calls).
        capacity, rate = 5, 10.0
        for _ in range(capacity):
            assert lim.take("f:user", capacity, rate).allowed
        client.config_resetstat()
        started = time.monotonic()
        denied = []
        while time.monotonic() - started < 1.0:  # about 10 retry windows
            denied.append(lim.take("f:user", capacity, rate))
        elapsed = time.monotonic() - started
        sent = calls(client, backend)
        windows = math.ceil(elapsed * rate)
        # Each allowed take that empties the bucket is remembered as the
        # denial the next take would get: one call per window (+1: its edge).
        assert sent <= windows + 1, (sent, windows)
        assert sum(d.source == "server" for d in denied) == sent
        assert sum(d.allowed for d in denied) >= windows - 2  # the refill still reaches the caller
        assert all(not d.allowed or d.source == "server" for d in denied)
    client.close()

"""Concurrency limits (docs/leases.md): acquire/release/renew, the lease
guards (sync and async), wait_acquire (TB.ACQUIRE with a timeout on the
module, polling on Lua) and fail-open, against real servers on every backend."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
import redis

from redis_tb import (
    InvalidArgument,
    Lease,
    LeaseDenied,
    LeaseLost,
    LimiterReplyError,
    LimiterUnavailable,
    RateLimiter,
    bucket_key,
)

from conftest import async_limiter, await_until, wait_until

# `<ms>-<n>-<incarnation>` (docs/leases.md#lease-ids).
ID = re.compile(r"^[0-9]+-[0-9]+-[0-9]+$")


def test_acquire_up_to_the_limit_then_denied(limiter):
    a = limiter.acquire("l:{a}", 2, 30_000)
    b = limiter.acquire("l:{a}", 2, 30_000)
    c = limiter.acquire("l:{a}", 2, 30_000)
    assert isinstance(a, Lease) and a.acquired and a.available == 1 and a.retry_after_ms == 0
    assert ID.match(a.lease) and ID.match(b.lease) and a.lease != b.lease
    assert a.lease.split("-")[1] == "1" and b.lease.split("-")[1] == "2"
    assert b.acquired and b.available == 0
    assert not c.acquired and c.lease is None and c.available == 0 and 29_000 < c.retry_after_ms <= 30_000
    assert not c.failed_open and c.key == "l:{a}" and c.limit == 2 and c.lease_ms == 30_000
    assert c.headers() == {"RateLimit-Policy": '"default";q=2;qu="concurrent-requests"', "Retry-After": "30"}
    assert a.headers() == {"RateLimit-Policy": '"default";q=2;qu="concurrent-requests"'}


def test_release_frees_a_slot_once(limiter):
    a = limiter.acquire("l:{r}", 1, 30_000)
    assert not limiter.acquire("l:{r}", 1, 30_000).acquired
    assert limiter.release("l:{r}", a) is True
    assert limiter.release("l:{r}", a.lease) is False  # twice is safe
    assert limiter.release("l:{r}", "123-456") is False  # never handed out
    assert limiter.release("l:{r}", None) is False  # no lease: no call
    b = limiter.acquire("l:{r}", 1, 30_000)
    assert b.acquired and b.lease != a.lease


def test_renew_keeps_a_live_lease_only(limiter):
    a = limiter.acquire("l:{n}", 1, 1000)
    assert limiter.renew("l:{n}", a, 60_000) is True
    time.sleep(1.1)  # past the first deadline, inside the renewed one
    assert not limiter.acquire("l:{n}", 1, 1000).acquired
    assert limiter.release("l:{n}", a) is True
    assert limiter.renew("l:{n}", a, 400) is False  # released: cannot come back
    assert limiter.renew("l:{n}", None, 400) is False


def test_a_lease_ends_by_itself(limiter):
    assert limiter.acquire("l:{e}", 1, 100).acquired
    time.sleep(0.2)
    d = limiter.acquire("l:{e}", 1, 100)
    assert d.acquired and d.available == 0


def test_arguments_are_checked_before_sending(limiter):
    for limit in (0, -1, 1.5, True, "2", 2**53 + 1, float("nan")):
        with pytest.raises(InvalidArgument):
            limiter.acquire("l:{x}", limit, 1000)
    for lease_ms in (0, 0.5, None):
        with pytest.raises(InvalidArgument):
            limiter.acquire("l:{x}", 1, lease_ms)
        with pytest.raises(InvalidArgument):
            limiter.renew("l:{x}", "1-1", lease_ms)
    with pytest.raises(InvalidArgument):
        limiter.release("l:{x}", 42)
    with pytest.raises(InvalidArgument):
        limiter.wait_acquire("l:{x}", 1, 1000, timeout_ms=-1)
    assert limiter.acquire("l:{x}", 2.0, 1000.0).acquired  # whole floats are fine


def test_errors_of_the_server_raise(limiter, setup):
    server = setup[0]
    with server.client() as r:
        r.hset("l:{w}", "tokens", "1")
        r.zadd("l:{z}", {"x": 1})
    with pytest.raises(LimiterReplyError, match="^WRONGTYPE"):
        limiter.acquire("l:{w}", 1, 1000)
    with pytest.raises(LimiterReplyError, match="^ERR corrupt lease set"):
        limiter.acquire("l:{z}", 1, 1000)


def test_guard_releases_on_exit_and_on_exception(limiter):
    with limiter.lease("l:{g}", 1, 30_000) as guard:
        assert ID.match(guard.lease) and not guard.lost and not guard.failed_open
        with pytest.raises(LeaseDenied) as denied:
            with limiter.lease("l:{g}", 1, 30_000):
                pass
        assert denied.value.retry_after_ms > 29_000 and not denied.value.decision.acquired
    with pytest.raises(RuntimeError):
        with limiter.lease("l:{g}", 1, 30_000):
            raise RuntimeError("the work failed")
    held = limiter.acquire("l:{g}", 1, 30_000)
    assert held.acquired  # both guards released their slot


def test_guard_renews_past_lease_ms(limiter):
    with limiter.lease("l:{k}", 1, 1000) as guard:
        time.sleep(1.5)  # past 1000 ms; renewed every 333 ms
        assert not limiter.acquire("l:{k}", 1, 1000).acquired
        assert guard.renewals >= 2 and not guard.lost
        guard.check()
    assert limiter.acquire("l:{k}", 1, 1000).acquired


def test_guard_stops_renewing_on_exit(limiter):
    with limiter.lease("l:{stop}", 1, 150) as guard:
        wait_until("a renewal", lambda: guard.renewals >= 1)
    renewals = guard.renewals
    assert renewals >= 1
    time.sleep(0.3)
    assert guard.renewals == renewals and not guard.lost  # no renewal after the release
    with pytest.raises(InvalidArgument):
        limiter.lease("l:{stop}", 1, 150, renew_every_ms=-1)


def test_guard_sees_a_lost_lease(limiter, setup):
    server = setup[0]
    with limiter.lease("l:{lost}", 1, 300) as guard:
        with server.client() as r:
            r.delete("l:{lost}")
        wait_until("the next renewal to answer 0", lambda: guard.lost)
        with pytest.raises(LeaseLost):
            guard.check()
    assert guard.release() is False


def test_guard_without_renewal(limiter):
    with limiter.lease("l:{no}", 1, 150, renew_every_ms=0):
        time.sleep(0.3)
        assert limiter.acquire("l:{no}", 1, 150).acquired  # it ended by itself


def test_wait_acquire_times_out_with_a_denial(limiter):
    assert limiter.acquire("l:{t}", 1, 60_000).acquired
    started = time.monotonic()
    d = limiter.wait_acquire("l:{t}", 1, 60_000, timeout_ms=300)
    took = time.monotonic() - started
    assert not d.acquired and d.lease is None and 59_000 < d.retry_after_ms <= 60_000
    assert 0.25 < took < 5.0, took


def test_wait_acquire_at_once_when_free(limiter):
    started = time.monotonic()
    d = limiter.wait_acquire("l:{f}", 3, 60_000, timeout_ms=10_000)
    assert d.acquired and d.available == 2 and time.monotonic() - started < 5.0  # not the timeout


def test_wait_acquire_woken_by_a_release(limiter):
    """Module: the server wakes the waiter (TB.ACQUIRE with timeout_ms);
    Lua: the polling loop sees the slot within its poll interval."""
    holder = limiter.acquire("l:{wk}", 1, 60_000)
    got = []
    t = threading.Thread(target=lambda: got.append(limiter.wait_acquire("l:{wk}", 1, 60_000, timeout_ms=10_000)))
    t.start()
    time.sleep(0.2)
    released = time.monotonic()
    assert limiter.release("l:{wk}", holder)
    t.join(10)
    assert got and got[0].acquired
    assert time.monotonic() - released < 5.0  # the release, not the lease's end in 60 s


@pytest.mark.parametrize("setup", ["module"], indirect=True)
def test_wait_acquire_is_first_come_first_served_with_the_module(limiter, setup):
    holder = limiter.acquire("l:{fifo}", 1, 60_000)
    order = []

    def wait(name):
        d = limiter.wait_acquire("l:{fifo}", 1, 60_000, timeout_ms=10_000)
        order.append((name, d))

    def blocked():
        with setup[0].client() as r:
            return r.info("clients")["blocked_clients"]

    first = threading.Thread(target=wait, args=("first",))
    first.start()
    wait_until("the first waiter to block in the server", lambda: blocked() == 1)
    second = threading.Thread(target=wait, args=("second",))
    second.start()
    wait_until("the second waiter to block behind it", lambda: blocked() == 2)
    assert not limiter.acquire("l:{fifo}", 1, 60_000).acquired  # nobody jumps the queue
    limiter.release("l:{fifo}", holder)
    first.join(5)
    assert [name for name, _ in order] == ["first"] and order[0][1].acquired
    limiter.release("l:{fifo}", order[0][1])
    second.join(5)
    assert [name for name, _ in order] == ["first", "second"] and order[1][1].acquired


def test_lease_keys_share_the_callers_slot(limiter):
    key = bucket_key("rl:", "}{", "inflight")
    assert key == "rl:{%7D%7B}:inflight"
    assert limiter.acquire(key, 1, 1000).acquired


def test_fail_open_with_the_server_stopped(own_server):
    client = redis.Redis(port=own_server.port)
    lim = RateLimiter(client)
    assert lim.acquire("l:{o}", 1, 1000).acquired
    own_server.kill()
    with pytest.raises(LimiterUnavailable):
        lim.acquire("l:{o}", 1, 1000)
    started = time.monotonic()
    d = lim.acquire("l:{o}", 1, 1000, fail_open=True)
    assert d.acquired and d.failed_open and d.lease is None and d.headers() == {}
    d = lim.wait_acquire("l:{o}", 1, 1000, timeout_ms=5000, fail_open=True)
    assert d.acquired and d.failed_open
    assert time.monotonic() - started < 1.0  # a refused connection fails at once
    assert lim.release("l:{o}", d) is False  # nothing to release, nothing sent
    with pytest.raises(LimiterUnavailable):
        lim.release("l:{o}", "1-1")
    with lim.lease("l:{o}", 1, 1000, fail_open=True) as guard:
        assert guard.failed_open and guard.lease is None and not guard.lost
    with pytest.raises(LimiterUnavailable):
        with lim.lease("l:{o}", 1, 1000):
            pass
    lim.close()
    client.close()


def test_guard_that_cannot_renew_for_lease_ms_is_lost(own_server):
    client = redis.Redis(port=own_server.port)
    lim = RateLimiter(client, timeout=0.1)
    with lim.lease("l:{hung}", 1, 400) as guard:
        own_server.pause()
        try:
            time.sleep(1.0)
            assert guard.lost and isinstance(guard.error, LimiterUnavailable)
            with pytest.raises(LeaseLost):
                guard.check()
        finally:
            own_server.resume()
    lim.close()
    client.close()


def test_guard_exit_when_the_server_went_away(own_server):
    client = redis.Redis(port=own_server.port)
    lim = RateLimiter(client)
    with lim.lease("l:{gone}", 1, 1000) as guard:
        own_server.kill()
    assert not guard.lost  # the release was logged, not raised: the lease ends by itself
    lim.close()
    client.close()


@pytest.fixture
def alimiter_args(setup):
    server, arg, expected = setup
    return server, arg, expected


def test_async_acquire_release_and_guard(alimiter_args):
    server, arg, expected = alimiter_args

    async def main():
        async with async_limiter(server.port, arg) as (client, lim):
            a = await lim.acquire("al:{a}", 1, 30_000)
            assert a.acquired and ID.match(a.lease) and lim.backend == expected
            assert not (await lim.acquire("al:{a}", 1, 30_000)).acquired
            assert await lim.renew("al:{a}", a, 30_000) is True
            assert await lim.release("al:{a}", a) is True
            assert await lim.release("al:{a}", a) is False
            with pytest.raises(ValueError):
                async with lim.lease("al:{a}", 1, 30_000):
                    raise ValueError("boom")
            async with lim.lease("al:{a}", 1, 1000) as guard:
                await asyncio.sleep(1.5)  # past 1000 ms; renewed every 333 ms
                assert not (await lim.acquire("al:{a}", 1, 1000)).acquired
                assert guard.renewals >= 2 and not guard.lost
            with pytest.raises(LeaseDenied):
                async with lim.lease("al:{a}", 1, 300):
                    async with lim.lease("al:{a}", 1, 300):
                        pass
            async with lim.lease("al:{lost}", 1, 300) as guard:
                await client.delete("al:{lost}")
                await await_until("the next renewal to answer 0", lambda: guard.lost)
                with pytest.raises(LeaseLost):
                    guard.check()

    asyncio.run(main())


def test_async_wait_acquire_woken_by_a_release(alimiter_args):
    server, arg, _ = alimiter_args

    async def main():
        async with async_limiter(server.port, arg) as (client, lim):
            holder = await lim.acquire("al:{w}", 1, 60_000)
            waiter = asyncio.ensure_future(lim.wait_acquire("al:{w}", 1, 60_000, timeout_ms=10_000))
            await asyncio.sleep(0.2)
            assert await lim.release("al:{w}", holder)
            d = await asyncio.wait_for(waiter, 5)
            assert d.acquired

    asyncio.run(main())


def test_async_fail_open(own_server):
    async def main():
        async with async_limiter(own_server.port) as (client, lim):
            assert (await lim.acquire("al:{o}", 1, 1000)).acquired
            own_server.kill()
            with pytest.raises(LimiterUnavailable):
                await lim.acquire("al:{o}", 1, 1000)
            d = await lim.acquire("al:{o}", 1, 1000, fail_open=True)
            assert d.acquired and d.failed_open and d.lease is None
            async with lim.lease("al:{o}", 1, 1000, fail_open=True) as guard:
                assert guard.failed_open

    asyncio.run(main())


# --- a cluster: leases on the slot owner, waits woken by a release ----------


@pytest.mark.parametrize("fixture", ["module_cluster", "plain_cluster"])
def test_cluster_wait_acquire_on_every_master(request, fixture):
    from redis.cluster import RedisCluster

    from test_cluster import reset, users

    cluster = request.getfixturevalue(fixture)
    reset(cluster)
    client = RedisCluster(host="127.0.0.1", port=cluster.port, socket_timeout=5, socket_connect_timeout=5)
    lim = RateLimiter(client, timeout=5)
    for t in users():
        key = bucket_key("rl:", t, "inflight")
        holder = lim.acquire(key, 1, 60_000)
        assert holder.acquired
        got = []
        waiter = threading.Thread(target=lambda: got.append(lim.wait_acquire(key, 1, 60_000, timeout_ms=5000)))
        waiter.start()
        time.sleep(0.2)
        assert lim.release(key, holder)
        waiter.join(6)
        assert got and got[0].acquired, (t, got)
        with lim.lease(key, 2, 300) as guard:
            wait_until("a renewal", lambda: guard.renewals >= 1)
            assert not guard.lost
    lim.close()
    client.close()


def test_a_flushed_lua_backend_is_detected_again(limiter, setup):
    """Server changed (FUNCTION FLUSH / SCRIPT FLUSH under the limiter):
    detected again, the call retried once, and the lease answers as before."""
    server, _, expected = setup
    a = limiter.acquire("l:{flush}", 2, 30_000)
    with server.client() as r:
        r.execute_command("FUNCTION", "FLUSH")
        r.execute_command("SCRIPT", "FLUSH")
    b = limiter.acquire("l:{flush}", 2, 30_000)
    assert a.acquired and b.acquired and b.available == 0 and limiter.backend == expected
    with server.client() as r:
        r.execute_command("FUNCTION", "FLUSH")
        r.execute_command("SCRIPT", "FLUSH")
    assert limiter.release("l:{flush}", a) is True
    with server.client() as r:
        r.execute_command("FUNCTION", "FLUSH")
        r.execute_command("SCRIPT", "FLUSH")
    assert limiter.renew("l:{flush}", b, 30_000) is True

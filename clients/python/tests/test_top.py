"""top() (docs/clients.md#the-most-denied-keys): TB.TOP on a standalone
server, and on every master of a 3-master cluster, merged (the most denied
first, ties by key bytes) and cut at `count`; key bytes exact; the
server's errors raised as reply errors, an unreachable master as
unavailable; sync and async."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from redis_tb import (AsyncRateLimiter, InvalidArgument, LimiterReplyError, LimiterUnavailable, RateLimiter, TopKey)

from conftest import Cluster, aclose, free_port
from test_cluster import reset, users

NOT_UTF8 = b"top:\xff\xfe\x80"


def top_reset(server):
    for node in getattr(server, "nodes", [server]):
        with node.client() as r:
            r.execute_command("TB.TOP", "RESET")


def deny(lim, key, times):
    """`times` denials of `key`: a bucket of 1 that does not refill in the test, taken once more."""
    answers = [lim.take(key, 1, 0.000001).allowed for _ in range(times + 1)]
    assert answers == [True] + [False] * times


def row(key: bytes, count: int) -> TopKey:
    return TopKey(key.decode("utf-8", "replace"), key, count, 0, 0, False)


def both(make, check):
    """`check(answer)` with a sync limiter and with an async one, each of
    `make(is_async) -> (limiter, client)`; `answer(method, *args)` calls the
    limiter's method (and waits for the async one's answer)."""
    lim, client = make(False)
    try:
        check(lambda method, *args: getattr(lim, method)(*args))
    finally:
        lim.close()
        client.close()

    async def main():
        alim, aclient = make(True)
        loop = asyncio.get_running_loop()
        try:
            # The checks are plain functions: they run in a thread, and each
            # call is run on this loop, which owns the async client.
            await loop.run_in_executor(None, check, lambda method, *args: asyncio.run_coroutine_threadsafe(
                getattr(alim, method)(*args), loop).result(60))
        finally:
            await alim.close()
            await aclose(aclient)

    asyncio.run(main())


def standalone(server, **kw):
    def make(is_async):
        client = (aredis.Redis if is_async else redis.Redis)(port=server.port, **kw)
        return (AsyncRateLimiter if is_async else RateLimiter)(client, timeout=2), client
    return make


def test_standalone_most_denied_first_and_cut_at_count(module_server):
    top_reset(module_server)
    lim = RateLimiter(module_server.client())
    for key, times in ((b"top:a", 3), (b"top:b", 5), (b"top:c", 3), (NOT_UTF8, 1)):
        deny(lim, key, times)
    lim.take(b"top:allowed", 5, 1)  # an allowed call counts nothing
    lim.peek(b"top:b", 1, 0.000001)  # nor a peek
    everything = [row(b"top:b", 5), row(b"top:a", 3), row(b"top:c", 3), row(NOT_UTF8, 1)]
    assert lim.backend == "module"

    def check(answer):
        assert answer("top") == everything
        assert answer("top", 2) == everything[:2]
        assert answer("top", 1) == everything[:1]
        assert answer("top", 2**53) == everything

    for decoding in (False, True):
        both(standalone(module_server, decode_responses=decoding), check)
    assert everything[3].key == "top:\ufffd\ufffd\ufffd" and everything[3].key_bytes == NOT_UTF8
    lim.close()


def test_a_long_key_comes_back_cut_and_marked(module_server):
    top_reset(module_server)
    lim = RateLimiter(redis.Redis(port=module_server.port))
    long_key = b"top:" + b"x" * 300
    deny(lim, long_key, 2)
    assert lim.top() == [TopKey(long_key[:256].decode(), long_key[:256], 2, 0, 0, True)]
    lim.close()


def test_count_is_checked_before_anything_is_sent():
    lim = RateLimiter(redis.Redis(port=free_port()))
    for bad in (0, -1, 1.5, 2**53 + 1, True, "10", None):
        with pytest.raises(InvalidArgument):
            lim.top(bad)

    async def main():
        alim = AsyncRateLimiter(aredis.Redis(port=free_port()))
        with pytest.raises(InvalidArgument):
            await alim.top(0)

    asyncio.run(main())


def test_without_the_module_the_reply_error_is_raised(plain_server, plain_cluster):
    def check(answer):
        with pytest.raises(LimiterReplyError) as e:
            answer("top")
        assert e.value.message.startswith("ERR unknown command"), e.value.message

    both(standalone(plain_server), check)
    both(cluster_limiters(plain_cluster), check)
    # top() detects no backend, and does not load Lua
    lim = RateLimiter(redis.Redis(port=plain_server.port))
    with pytest.raises(LimiterReplyError):
        lim.top()
    assert lim.backend is None
    lim.close()


def test_an_acl_without_tb_top_raises_noperm(module_server):
    with module_server.client() as r:
        r.execute_command("ACL", "SETUSER", "tb-no-top", "on", ">pw", "~*", "+@all", "-tb.top")
    try:
        def check(answer):
            with pytest.raises(LimiterReplyError) as e:
                answer("top", 3)
            assert e.value.message.startswith("NOPERM"), e.value.message

        both(standalone(module_server, username="tb-no-top", password="pw"), check)
    finally:
        with module_server.client() as r:
            r.execute_command("ACL", "DELUSER", "tb-no-top")


def test_an_unreachable_server_is_unavailable():
    def check(answer):
        with pytest.raises(LimiterUnavailable):
            answer("top")

    both(standalone(type("Nothing", (), {"port": free_port()})), check)


# --- clusters ---------------------------------------------------------------------


def cluster_limiters(cluster):
    def make(is_async):
        client = (AsyncRedisCluster if is_async else RedisCluster)(
            host="127.0.0.1", port=cluster.port, socket_timeout=2, socket_connect_timeout=2)
        return (AsyncRateLimiter if is_async else RateLimiter)(client, timeout=2), client
    return make


def test_cluster_answers_of_every_master_merged(module_cluster):
    reset(module_cluster)
    top_reset(module_cluster)
    first, second, third = (u.encode() for u in users())  # a hash tag on each master
    a, b, c = b"{%s}:a" % first, b"{%s}:b" % second, b"{%s}:c" % third
    d, odd = b"{%s}:d" % first, b"{%s}:" % second + NOT_UTF8
    lim, client = cluster_limiters(module_cluster)(False)
    for key, times in ((a, 4), (b, 4), (c, 6), (d, 1), (odd, 2)):
        deny(lim, key, times)
    # each master answers for its own keys only
    per_node = []
    for node in module_cluster.nodes:
        with node.client() as r:
            per_node.append(sorted(x[0] for x in r.execute_command("TB.TOP", "COUNT", 10)))
    assert sorted(per_node) == sorted([[a, d], [b, odd], [c]])
    merged = [row(c, 6)] + sorted([row(a, 4), row(b, 4)], key=lambda r: r.key_bytes) + [row(odd, 2), row(d, 1)]
    lim.close()
    client.close()

    def check(answer):
        assert answer("top") == merged
        assert answer("top", 3) == merged[:3]  # the cut is of the merged list, across masters
        assert answer("top", 2) == merged[:2]
        assert answer("top", 1) == merged[:1]

    both(cluster_limiters(module_cluster), check)


def test_cluster_with_a_master_down_is_unavailable_not_partial():
    cluster = Cluster(module=True)
    try:
        make = cluster_limiters(cluster)
        lim, client = make(False)
        deny(lim, b"{%s}:x" % users()[0].encode(), 2)
        assert [r.count for r in lim.top()] == [2]
        lim.close()
        client.close()
        cluster.nodes[2].kill()

        def check(answer):
            with pytest.raises(LimiterUnavailable):
                answer("top")

        both(make, check)
    finally:
        cluster.stop()

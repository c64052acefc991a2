"""A 3-master cluster, with the module and without it (the Lua library or
script loaded on every master), through redis-py's cluster clients."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from redis_tb import AsyncRateLimiter, Limit, RateLimiter

from test_api import SLOW

CASES = [("module_cluster", "auto", "module"), ("plain_cluster", "auto", "function"),
         ("plain_cluster", "script", "script")]


def cluster_client(cluster):
    return RedisCluster(host="127.0.0.1", port=cluster.port, socket_timeout=1, socket_connect_timeout=1)


def reset(cluster):
    for node in cluster.nodes:
        with node.client() as r:
            r.flushall()
            r.execute_command("FUNCTION", "FLUSH")
            r.execute_command("SCRIPT", "FLUSH")


def users():
    """One user per master: hash tags that land on each slot range."""
    from redis.crc import key_slot

    found = {}
    i = 0
    while len(found) < 3:
        tag = f"user:{i}"
        slot = key_slot(tag.encode())
        found.setdefault(0 if slot <= 5460 else 1 if slot <= 10922 else 2, tag)
        i += 1
    return [found[k] for k in sorted(found)]


@pytest.mark.parametrize("fixture,arg,expected", CASES)
def test_cluster_take_and_take_all(request, fixture, arg, expected):
    cluster = request.getfixturevalue(fixture)
    reset(cluster)
    client = cluster_client(cluster)
    lim = RateLimiter(client, backend=arg)
    assert lim.connect() == expected
    for user in users():
        for left in (4, 3):
            assert lim.take(f"{{{user}}}:single", 5, SLOW).remaining == left
        limits = [Limit(f"{{{user}}}:sec", 10, SLOW, 1, "sec"), Limit(f"{{{user}}}:day", 2, SLOW, 1, "day")]
        assert [lim.take_all(limits).remaining for _ in range(3)] == [1, 0, 0]
        d = lim.take_all(limits)
        assert not d.allowed and d.index == 1 and d.policy == "day"
        assert lim.peek(f"{{{user}}}:sec", 10, SLOW).remaining == 7  # 2 taken, peek n=1
    # every master holds buckets of its own
    for node in cluster.nodes:
        with node.client() as r:
            assert r.dbsize() == 3
    client.close()


@pytest.mark.parametrize("fixture,arg,expected", CASES)
def test_cluster_async(request, fixture, arg, expected):
    cluster = request.getfixturevalue(fixture)
    reset(cluster)

    async def main():
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.port)
        lim = AsyncRateLimiter(client, backend=arg, timeout=2)
        assert await lim.connect() == expected
        for user in users():
            assert (await lim.take(f"{{{user}}}:a", 5, SLOW, 2)).remaining == 3
            d = await lim.take_all([Limit(f"{{{user}}}:a", 5, SLOW, 1), Limit(f"{{{user}}}:b", 5, SLOW, 4)])
            assert d.allowed and d.index == 1 and d.remaining == 1
        await client.aclose()

    asyncio.run(main())


def test_cluster_script_after_flush(plain_cluster):
    """NOSCRIPT on a node: the call is repeated with the full text there."""
    reset(plain_cluster)
    client = cluster_client(plain_cluster)
    lim = RateLimiter(client, backend="script")
    tags = users()
    assert [lim.take(f"{{{t}}}:k", 5, SLOW).remaining for t in tags] == [4, 4, 4]
    for node in plain_cluster.nodes:
        with node.client() as r:
            r.execute_command("SCRIPT", "FLUSH")
    assert [lim.take(f"{{{t}}}:k", 5, SLOW).remaining for t in tags] == [3, 3, 3]
    client.close()


def test_cluster_wait_take_module(module_cluster):
    reset(module_cluster)
    client = cluster_client(module_cluster)
    lim = RateLimiter(client)
    for t in users():
        assert lim.take(f"{{{t}}}:w", 1, 20).allowed
        assert lim.wait_take(f"{{{t}}}:w", 1, 20, timeout_ms=3000).allowed
        assert not lim.wait_take(f"{{{t}}}:slow", 1, SLOW, 2, timeout_ms=3000).allowed
    client.close()

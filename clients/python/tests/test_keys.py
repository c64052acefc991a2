"""Keys no id can break (docs/clients.md#keys-no-id-can-break): the id is
escaped so that its buckets always share one slot, checked with the
server's own CLUSTER KEYSLOT and with multi-policy takes in a cluster."""

from __future__ import annotations


import pytest
from flask import Flask
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from redis_tb import (AsyncRateLimiter, Limit, LimiterError, LimiterUnavailable, Policy, RateLimiter, bucket_key,
                      escape_id)
from redis_tb.asgi import RateLimitMiddleware as AsgiLimit
from redis_tb.wsgi import RateLimitMiddleware as WsgiLimit

from test_api import SLOW
from test_cluster import cluster_client, reset

HOSTILE = ["}x", "}{", "{}", "{", "}", "x}y{z", "{a}", "%7D", "50%", "", "%", "{{}}"]


def test_ids_without_braces_or_percent_are_unchanged():
    assert bucket_key("ratelimit:", "alice", "sec") == "ratelimit:{alice}:sec"
    assert bucket_key("ratelimit:", "10.0.0.1", "day") == "ratelimit:{10.0.0.1}:day"


def test_escaping_is_exactly_the_documented_table():
    assert escape_id("}x") == "%7Dx"
    assert escape_id("{}") == "%7B%7D"
    assert escape_id("50%") == "50%25"
    assert escape_id("") == "%"
    assert escape_id("%7D") == "%257D"


@pytest.mark.parametrize("identity", HOSTILE)
def test_an_escaped_id_holds_no_brace_and_is_never_empty(identity):
    escaped = escape_id(identity)
    assert escaped and "{" not in escaped and "}" not in escaped


def test_different_ids_never_share_a_key():
    ids = HOSTILE + ["x", "%7B", "%257D", "%25", "a"]
    assert len({escape_id(i) for i in ids}) == len(set(ids))


def test_the_server_puts_every_bucket_of_a_hostile_id_in_one_slot(plain_cluster):
    with plain_cluster.nodes[0].client() as r:
        for identity in HOSTILE:
            sec, day = (bucket_key("ratelimit:", identity, p) for p in ("sec", "day"))
            slots = {r.execute_command("CLUSTER", "KEYSLOT", k) for k in (sec, day)}
            assert len(slots) == 1, (identity, sec, day, slots)
            # and it is the slot of the escaped id alone: the hash tag is exactly it
            assert slots == {r.execute_command("CLUSTER", "KEYSLOT", escape_id(identity))}


def hostile_flask(limiter):
    app = Flask(__name__)
    app.add_url_rule("/", "hello", lambda: "hello")
    app.wsgi_app = WsgiLimit(app.wsgi_app, limiter, [Policy(10, SLOW, "sec"), Policy(2, SLOW, "day")],
                             key=lambda environ: environ.get("HTTP_X_USER", "anon"))
    return app.test_client()


@pytest.mark.parametrize("fixture", ["module_cluster", "plain_cluster"])
def test_a_hostile_id_is_limited_by_every_policy_in_a_cluster(request, fixture):
    cluster = request.getfixturevalue(fixture)
    reset(cluster)
    client = cluster_client(cluster)
    tc = hostile_flask(RateLimiter(client))
    for identity in ["}x", "}{", "", "{}"]:
        statuses = [tc.get("/", headers={"X-User": identity}) for _ in range(3)]
        assert [r.status_code for r in statuses] == [200, 200, 429], identity
        assert statuses[0].headers["RateLimit"] == '"day";r=1;t=1000'
    client.close()


def test_a_hostile_id_is_limited_by_every_policy_in_a_cluster_async(module_cluster):
    reset(module_cluster)

    async def hello(request):
        return PlainTextResponse("hello")

    client = AsyncRedisCluster(host="127.0.0.1", port=module_cluster.port)
    lim = AsyncRateLimiter(client, timeout=2)
    app = AsgiLimit(Starlette(routes=[Route("/", hello)]), lim, [Policy(10, SLOW, "sec"), Policy(2, SLOW, "day")],
                    key=lambda scope: dict(scope["headers"]).get(b"x-user", b"").decode())
    with TestClient(app) as tc:
        for identity in ["}x", "{"]:
            assert [tc.get("/", headers={"x-user": identity}).status_code for _ in range(3)] == [200, 200, 429]
    assert app.outcomes.error_count == 0 and app.outcomes.unavailable_count == 0


def test_a_take_all_across_slots_is_a_bug_not_an_outage(module_cluster):
    """What escaping prevents, done on purpose: keys in two slots. redis-py
    refuses it before sending (or the server answers CROSSSLOT): a bug."""
    reset(module_cluster)
    client = cluster_client(module_cluster)
    lim = RateLimiter(client)
    with pytest.raises(LimiterError) as e:
        lim.take_all([Limit("{a}:sec", 5, SLOW), Limit("{b}:day", 5, SLOW)])
    assert not isinstance(e.value, LimiterUnavailable)
    client.close()

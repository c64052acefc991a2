"""The shared conformance suite (clients/conformance/cases.json, see
docs/clients.md#the-conformance-suite): every case on every backend and
topology it names. "lua" runs both ways Python has it, the Lua function
and the Lua script; the same keys and answers are expected of both.

Python's spelling of the case's names: take/peek/refund/wait_take/take_all
are the methods of the same name, `policy` their keyword, decision fields
are `Decision` attributes, errors are InvalidArgument / LimiterUnavailable
/ LimiterReplyError, `keys` is `bucket_key`, `classify` the failure rule's
function (over the reply's text, and over redis-py's exception for it).
metrics.json's cases run sync and async, each limiter with a meter provider
of its own read by the SDK's InMemoryMetricReader."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time

import pytest
import redis
import redis.asyncio as aredis
from redis._parsers import BaseParser
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

import redis_tb
from redis_tb import (AsyncRateLimiter, InvalidArgument, Limit, LimiterReplyError, LimiterUnavailable, RateLimiter,
                      bucket_key)
from redis_tb._core import classify, classify_reply

from conftest import REPO, free_port
from test_cluster import reset

CASES = json.loads((REPO / "clients" / "conformance" / "cases.json").read_text(encoding="utf-8"))
# The lease cases: the same format, in a file of their own (its "about" says why).
LEASES = json.loads((REPO / "clients" / "conformance" / "leases.json").read_text(encoding="utf-8"))
# Reservations, charges, settling, lockout: the same format, a file of its own.
JOBS = json.loads((REPO / "clients" / "conformance" / "jobs.json").read_text(encoding="utf-8"))
# The one resend after a dropped connection: the same format, with `kill_clients`.
RESEND = json.loads((REPO / "clients" / "conformance" / "resend.json").read_text(encoding="utf-8"))
# The metrics: the same calls, with `limiter`, `server` and `metrics` (its about).
METRICS = json.loads((REPO / "clients" / "conformance" / "metrics.json").read_text(encoding="utf-8"))
# jobs.json's lua runs wait for the Lua twin of those commands (its "about").
LUA_HAS_JOBS = "tb_charge" in (REPO / "lua" / "tb.lua").read_text(encoding="utf-8")
# `<ms>-<n>-<incarnation>` (docs/leases.md#lease-ids): every case makes its sets anew.
LEASE_ID = re.compile(r"^[0-9]+-[0-9]+-[0-9]+$")

# (backend of the case, topology) -> how Python runs it: [(server fixture, backend argument)]
WAYS = {
    ("module", "standalone"): [("module_server", "auto")],
    ("lua", "standalone"): [("plain_server", "auto"), ("plain_server", "script")],
    ("module", "cluster"): [("module_cluster", "auto")],
    ("lua", "cluster"): [("plain_cluster", "auto"), ("plain_cluster", "script")],
}
EXPECTED_BACKEND = {"module": "module", "auto": "function", "script": "script"}
ERRORS = {"invalid_argument": InvalidArgument, "unavailable": LimiterUnavailable, "reply": LimiterReplyError}


def runs():
    jobs = [id(case) for case in JOBS["cases"]]
    for case in CASES["cases"] + LEASES["cases"] + JOBS["cases"]:
        for backend in case["backends"]:
            for topology in case["topologies"]:
                for fixture, arg in WAYS[(backend, topology)]:
                    way = EXPECTED_BACKEND["module" if backend == "module" else arg]
                    marks = ()
                    if backend == "lua" and id(case) in jobs and not LUA_HAS_JOBS:
                        marks = pytest.mark.skip(reason="lua/tb.lua has no tb_charge yet (jobs.json's about)")
                    yield pytest.param(case, topology, fixture, arg, id=f"{case['name']}-{way}-{topology}", marks=marks)


def test_the_suite_has_the_version_this_runner_reads():
    assert CASES["version"] == 1 and CASES["cases"]
    assert LEASES["version"] == 1 and LEASES["cases"]
    assert JOBS["version"] == 1 and JOBS["cases"]
    assert RESEND["version"] == 1 and RESEND["cases"]
    assert METRICS["version"] == 1 and METRICS["cases"]


@pytest.fixture
def limiter_for(request):
    made = []

    def make(topology, fixture, arg):
        server = request.getfixturevalue(fixture)
        if topology == "cluster":
            reset(server)
            client = RedisCluster(host="127.0.0.1", port=server.port, socket_timeout=5, socket_connect_timeout=5)
        else:
            with server.client() as r:
                r.flushall()
                r.execute_command("FUNCTION", "FLUSH")
                r.execute_command("SCRIPT", "FLUSH")
            client = redis.Redis(port=server.port)
        lim = RateLimiter(client, backend=arg, timeout=5)
        made.append((lim, client))
        return lim, client

    yield make
    for lim, client in made:
        lim.close()
        client.close()


def check_decision(d, expected: dict):
    for field, want in expected.items():
        got = getattr(d, field)
        if field == "lease" and want == "<id>":
            assert isinstance(got, str) and LEASE_ID.match(got), (field, got, want)
        elif isinstance(want, list):
            assert want[0] <= got <= want[1], (field, got, want)
        else:
            assert got == want, (field, got, want)


def lease_arg(call, saved):
    lease = call["lease"]
    return saved[lease[1:]] if lease.startswith("$") else lease


def call_limiter(lim, call, saved=None):
    op = call["op"]
    kw = {"policy": call["policy"]} if "policy" in call else {}
    if call.get("fail_open"):
        kw["fail_open"] = True
    if op == "acquire":
        return lim.acquire(call["key"], call["limit"], call["lease_ms"], **kw)
    if op == "wait_acquire":
        return lim.wait_acquire(call["key"], call["limit"], call["lease_ms"], timeout_ms=call["timeout_ms"], **kw)
    if op == "release":
        return lim.release(call["key"], lease_arg(call, saved))
    if op == "renew":
        return lim.renew(call["key"], lease_arg(call, saved), call["lease_ms"])
    if op == "take_all":
        wait = {"max_wait_ms": call["max_wait_ms"]} if "max_wait_ms" in call else {}
        return lim.take_all([Limit(x["key"], x["capacity"], x["rate"], x.get("n", 1), x.get("policy"),
                                   x.get("block_ms"), x.get("max_block_ms"))
                             for x in call["limits"]], **wait)
    if op == "unblock":
        return lim.unblock(call["key"])
    if op in ("charge", "settle"):
        limit = Limit(call["key"], call["capacity"], call["rate"], policy=call.get("policy"))
        if op == "settle":
            return lim.settle(limit, call["reserved"], call["actual"])
        return lim.charge(limit, call["n"], max_debt=call.get("max_debt"))
    args = (call["key"], call["capacity"], call["rate"], call.get("n", 1))
    if op == "wait_take":
        return lim.wait_take(*args, timeout_ms=call["timeout_ms"], **kw)
    if op == "take":
        kw.update({name: call[name] for name in ("max_wait_ms", "block_ms", "max_block_ms") if name in call})
    return getattr(lim, op)(*args, **kw)


def run_keys(call, topology, client, lim):
    keys = [bucket_key(call["prefix"], call["id"], p) for p in call["policies"]]
    assert keys == call["expect"]
    if topology == "cluster":
        slots = {client.execute_command("CLUSTER", "KEYSLOT", k, target_nodes=RedisCluster.RANDOM) for k in keys}
        assert len(slots) == 1, (call["id"], keys, slots)
        d = lim.take_all([Limit(k, 5, 0.001, 1, p) for k, p in zip(keys, call["policies"])])
        assert d.allowed


@pytest.mark.parametrize("case,topology,fixture,arg", list(runs()))
def test_case(limiter_for, case, topology, fixture, arg):
    lim, client = limiter_for(topology, fixture, arg)
    saved = {}
    for command in case.get("setup", []):
        client.execute_command(*command)
    for i, call in enumerate(case["calls"]):
        where = f"call {i}: {call}"
        if call["op"] == "classify":
            assert classify_reply(call["reply"]) == call["class"], where
            assert classify(BaseParser.parse_error(call["reply"])) == call["class"], where
            continue
        if call["op"] == "keys":
            run_keys(call, topology, client, lim)
            continue
        if call["op"] == "sleep":
            time.sleep(call["ms"] / 1000)
            continue
        if "error" in call:
            with pytest.raises(ERRORS[call["error"]]) as e:
                call_limiter(lim, call, saved)
            assert str(e.value).startswith(call["message"]), (where, str(e.value))
            continue
        d = call_limiter(lim, call, saved)
        if "result" in call:
            assert d is call["result"], where
        if "save" in call:
            saved[call["save"]] = d.lease
        if "id_count" in call:
            assert int(d.lease.split("-")[1]) == call["id_count"], (where, d.lease)
        if "decision" in call:
            check_decision(d, call["decision"])
        if "headers" in call:
            assert d.headers() == call["headers"], where
    if case["calls"][0]["op"] not in ("classify", "keys") and "error" not in case["calls"][0]:
        assert lim.backend == EXPECTED_BACKEND["module" if fixture.startswith("module") else arg]


def sync_and_async_runs(cases):
    """Every case on every backend and topology it names, sync and async."""
    for case in cases["cases"]:
        for backend in case["backends"]:
            for topology in case["topologies"]:
                for fixture, arg in WAYS[(backend, topology)]:
                    way = EXPECTED_BACKEND["module" if backend == "module" else arg]
                    for mode in ("sync", "async"):
                        yield pytest.param(case, topology, fixture, arg, mode,
                                           id=f"{case['name']}-{way}-{topology}-{mode}")


def resend_runs():
    return sync_and_async_runs(RESEND)


def kill_clients(server, topology):
    """resend.json's kill_clients: every node closes every connection but
    this one's (the limiter's included, blocking ones too); no restart."""
    for node in server.nodes if topology == "cluster" else [server]:
        with node.client() as r:
            r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


async def run_resend_case(lim, server, topology, case):
    refunded = 0  # tokens a refund after the kill gave back (resend.json's about)
    for i, call in enumerate(case["calls"]):
        where = f"call {i}: {call}"
        if call["op"] == "kill_clients":
            kill_clients(server, topology)
            continue
        answer = call_limiter(lim, call)
        if "error" in call and call["op"] == "refund":
            # redis-py finds the closed connection before it writes (its pool
            # checks a connection before lending it) and sends the refund on
            # a new one: never written before, so it runs once.
            try:
                d = await answer if asyncio.iscoroutine(answer) else answer
            except ERRORS[call["error"]] as e:
                assert str(e).startswith(call["message"]), (where, str(e))
            else:
                assert d.allowed, where
                refunded = call["n"]
            continue
        if "error" in call:
            with pytest.raises(ERRORS[call["error"]]) as e:
                await answer if asyncio.iscoroutine(answer) else answer
            assert str(e.value).startswith(call["message"]), (where, str(e.value))
            continue
        d = await answer if asyncio.iscoroutine(answer) else answer
        expected = dict(call["decision"])
        if "remaining" in expected:
            expected["remaining"] += refunded
        check_decision(d, expected)


@pytest.mark.parametrize("case,topology,fixture,arg,mode", list(resend_runs()))
def test_resend_case(request, case, topology, fixture, arg, mode):
    server = request.getfixturevalue(fixture)
    if topology == "cluster":
        reset(server)
    else:
        with server.client() as r:
            r.flushall()
            r.execute_command("FUNCTION", "FLUSH")
            r.execute_command("SCRIPT", "FLUSH")
    # Timeouts of 10 s: what a case checks is how often a call ran, never how
    # fast; a cluster client rebuilding every connection after CLIENT KILL
    # needed more than 1 s on a busy 2-core machine.
    if mode == "sync":
        client = (RedisCluster(host="127.0.0.1", port=server.port, socket_timeout=10, socket_connect_timeout=10)
                  if topology == "cluster" else redis.Redis(port=server.port))
        lim = RateLimiter(client, backend=arg, timeout=10)
        try:
            asyncio.run(run_resend_case(lim, server, topology, case))
        finally:
            lim.close()
            client.close()
        return

    async def run_async():
        client = (AsyncRedisCluster(host="127.0.0.1", port=server.port, socket_timeout=10, socket_connect_timeout=10)
                  if topology == "cluster" else aredis.Redis(port=server.port))
        lim = AsyncRateLimiter(client, backend=arg, timeout=10)
        try:
            await run_resend_case(lim, server, topology, case)
        finally:
            await lim.close()
            await client.aclose() if hasattr(client, "aclose") else await client.close()

    asyncio.run(run_async())


def metrics_runs():
    return sync_and_async_runs(METRICS)


def collected(reader) -> dict:
    """{instrument: (metric, {attributes as a frozenset: data point})} of
    one collection; every metric must be the limiter's own scope."""
    found = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            assert (scope.scope.name, scope.scope.version) == ("redis-tb", redis_tb.__version__)
            for metric in scope.metrics:
                assert metric.name not in found, metric.name
                points = {frozenset(p.attributes.items()): p for p in metric.data.data_points}
                found[metric.name] = (metric, points)
    return found


def check_metrics(reader, expected: dict):
    """metrics.json's `metrics`: each instrument has exactly the listed data
    points (by all their attributes) with their value or count, and the
    instruments it does not name have none."""
    from opentelemetry.sdk.metrics.export import Histogram, Sum

    kinds = {"counter": Sum, "histogram": Histogram}
    found = collected(reader)
    known = {instrument["name"] for instrument in METRICS["instruments"]}
    assert set(found) <= known, set(found)
    for instrument in METRICS["instruments"]:
        name = instrument["name"]
        wanted = expected.get(name, [])
        metric, points = found.get(name, (None, {}))
        assert set(points) == {frozenset(w["attributes"].items()) for w in wanted}, (name, list(points))
        if not wanted:
            continue
        assert metric.unit == instrument["unit"] and isinstance(metric.data, kinds[instrument["kind"]]), name
        if instrument["kind"] == "counter":
            assert metric.data.is_monotonic, name
        for want in wanted:
            assert sorted(want["attributes"]) == sorted(instrument["attributes"]), (name, want)
            point = points[frozenset(want["attributes"].items())]
            if "value" in want:
                assert point.value == want["value"], (name, want, point.value)
            if "count" in want:
                assert point.count == want["count"], (name, want, point.count)
                assert 0 <= point.sum and math.isfinite(point.sum), (name, point.sum)


# Expectations of metrics.json that no server gives, as the runner corrects
# them while the file has them (the metrics they come with are checked as
# written): (case, call index, field) -> (the file's value, the answer).
# A peek answers what a take would (docs/commands.md), so a peek of 1 of a
# full bucket of 5 leaves 4, as in cases.json.
async def answer_of(lim, call):
    """`call_limiter`'s answer, awaited if the limiter is async."""
    answer = call_limiter(lim, call)
    return await answer if asyncio.iscoroutine(answer) else answer


async def run_metrics_calls(lim, case):
    for i, call in enumerate(case["calls"]):
        where = f"call {i}: {call}"
        if "error" in call:
            with pytest.raises(ERRORS[call["error"]]) as e:
                await answer_of(lim, call)
            assert str(e.value).startswith(call.get("message", "")), (where, str(e.value))
            continue
        check_decision(await answer_of(lim, call), call["decision"])


@pytest.mark.parametrize("case,topology,fixture,arg,mode", list(metrics_runs()))
def test_metrics_case(request, case, topology, fixture, arg, mode):
    """clients/conformance/metrics.json: the calls on a limiter given a
    meter provider of its own, read with the SDK's in-memory reader."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    options = dict(case.get("limiter", {}), meter_provider=provider)
    unreachable = case.get("server") == "unreachable"
    if unreachable:
        assert topology == "standalone", case["name"]
        port = free_port()
    else:
        server = request.getfixturevalue(fixture)
        port = server.port
        if topology == "cluster":
            reset(server)
        else:
            with server.client() as r:
                r.flushall()
                r.execute_command("FUNCTION", "FLUSH")
                r.execute_command("SCRIPT", "FLUSH")

    def expect_backend(lim):
        assert lim.backend == (None if unreachable else EXPECTED_BACKEND["module" if fixture.startswith("module") else arg])

    try:
        if mode == "sync":
            client = (RedisCluster(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5)
                      if topology == "cluster" else redis.Redis(port=port))
            lim = RateLimiter(client, backend=arg, timeout=5, **options)
            try:
                asyncio.run(run_metrics_calls(lim, case))
                expect_backend(lim)
            finally:
                lim.close()
                client.close()
        else:
            async def run_async():
                client = (AsyncRedisCluster(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5)
                          if topology == "cluster" else aredis.Redis(port=port))
                lim = AsyncRateLimiter(client, backend=arg, timeout=5, **options)
                try:
                    await run_metrics_calls(lim, case)
                    expect_backend(lim)
                finally:
                    await lim.close()
                    await client.aclose() if hasattr(client, "aclose") else await client.close()

            asyncio.run(run_async())
        check_metrics(reader, case["metrics"])
    finally:
        provider.shutdown()

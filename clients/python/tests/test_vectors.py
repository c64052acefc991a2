"""The core's vectors (clients/conformance/vectors/, written by the pure core)
replayed against the rules this library writes again, without a server: the
bucket's take (take.json; peek.json without a lock), take_all (takeall.json
without options), first_ms_when and the denial cache's priming window. Each
vector's stored state, limit, n and clock go in; the reply figures and the
state written must come out exactly (the doubles bit for bit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from redis_tb import _local

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "vectors"


def vectors(rule, keep=lambda v: True):
    found = [v for v in json.loads((VECTORS / f"{rule}.json").read_text())["vectors"] if keep(v)]
    assert found, f"no vectors in {rule}.json"
    return pytest.mark.parametrize("vector", found, ids=[v["name"] for v in found])


def stored(state):
    """A vector's stored bucket as the local limiter keeps one: (tokens, last_refill_ms)."""
    return None if state is None else (state["tokens"], state["last_refill_ms"])


def reply_of(allowed, outcome):
    return {"allowed": allowed, "remaining": outcome[1], "retry_after_ms": outcome[2],
            "reset_after_ms": outcome[3]}


def written(write):
    """What the local limiter stores of a vector's write: the tokens and last_refill."""
    return None if write is None else (write["tokens"], write["last_refill_ms"])


def take(vector):
    config = vector["config"]
    return _local.take(stored(vector["state"]), config["capacity"], config["rate"], vector["n"], vector["now_ms"])


@vectors("take")
def test_a_local_take_replies_and_writes_as_the_core(vector):
    outcome = take(vector)
    assert reply_of(outcome[0], outcome) == vector["expect"]["reply"]
    assert outcome[4] == written(vector["expect"]["write"])


@vectors("peek", keep=lambda v: v["state"] is None or "lock" not in v["state"])
def test_a_local_peek_replies_as_the_core(vector):
    outcome = take(vector)
    assert reply_of(outcome[0], outcome) == vector["expect"]["reply"]


@vectors("takeall", keep=lambda v: not v["options"])
def test_a_local_take_all_takes_from_every_bucket_or_none_as_the_core(vector):
    buckets = vector["buckets"]
    limits = [(b["config"]["capacity"], b["config"]["rate"], b["n"]) for b in buckets]
    allowed, index, outcomes = _local.take_all([stored(b["state"]) for b in buckets], limits, vector["now_ms"])
    expect = vector["expect"]
    assert {**reply_of(allowed, outcomes[index]), "index": index} == expect["reply"]
    assert [o[4] for o in outcomes] == [written(w) for w in expect["writes"]]


@vectors("first_ms_when")
def test_first_ms_when_is_the_cores(vector):
    state, config = vector["state"], vector["config"]
    got = _local.first_ms_when(state["tokens"], state["last_refill_ms"], config["capacity"], config["rate"],
                               float(vector["now_ms"]), vector["wanted"])
    assert got == vector["expect"]["ms"]


@vectors("denial_cache")
def test_the_denial_cache_primes_the_cores_window(vector):
    config, reply = vector["config"], vector["reply"]
    got = _local.primed_denial_ms(reply["remaining"], vector["n"], config["capacity"], config["rate"],
                                reply["reset_after_ms"])
    assert got == vector["expect"]["window_ms"]

"""The local limiter and the denial cache without a server: the core's
case table (clients/conformance/vectors/local.json) replayed on a virtual clock,
the LRU bound, the outage's probes and logs, and the cache's rules."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from redis_tb import _core, _engine, _local
from redis_tb._core import Decision, InvalidArgument, Limit, LimiterUnavailable

CASES = json.loads((Path(__file__).resolve().parents[2] / "conformance" / "vectors" / "local.json").read_text())["cases"]
FIELDS = ("allowed", "remaining", "retry_after_ms", "reset_after_ms")


def call_of(step):
    if step["op"] == "take_all":
        return _core.take_all([Limit(l["key"], l["capacity"], l["rate"], l["n"]) for l in step["limits"]])
    return _core.single(step["op"], step["key"], step["capacity"], step["rate"], step["n"], "default")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_local_limiter_replays_the_core_case_table(case):
    buckets = _local.LocalLimiter(case["instances"], 10_000)
    for i, step in enumerate(case["steps"]):
        d = buckets.decide(call_of(step), step["now_ms"])
        got = {f: getattr(d, f) for f in FIELDS}
        if "index" in step["expect"]:
            got["index"] = d.index
        assert got == step["expect"], f"step {i}: {step}"
        assert d.source == "local"


def test_the_allowed_takes_reset_time_is_first_ms_when_of_the_written_bucket():
    # _full_after is first_ms_when's usual case, inline: it must answer the
    # same on every bucket an allowed take can write, awkward doubles included.
    rng = random.Random(26)
    now = 1_764_000_000_123.0
    for _ in range(20_000):
        capacity = rng.choice([1.0, 3.0, 5.0, 10.0, 1e9, 2.0**53, rng.uniform(1e-6, 1e6)])
        rate = rng.choice([0.001, 0.1, 1.0, 7.0, 10.0, 1e9, 1e-300, rng.uniform(1e-9, 1e7)])
        left = rng.choice([0.0, capacity, capacity * (1 - 1e-16), rng.uniform(0.0, capacity),
                           float(rng.randint(0, 10))])
        if left > capacity:
            left = capacity
        want = _local.first_ms_when(left, now, capacity, rate, now, capacity)
        assert _local._full_after(left, capacity, rate, now) == want, (left, capacity, rate)


def test_the_local_buckets_are_an_lru_of_local_max_keys():
    buckets = _local.LocalLimiter(1, 2)
    take = lambda key: buckets.decide(_core.single("take", key, 1, 0.001, 1, "default"), 0)
    assert take("a").allowed and take("b").allowed
    assert not take("a").allowed  # a is now the most recently used
    assert take("c").allowed  # forgets b
    assert list(buckets.buckets) == ["a", "c"]
    assert take("b").allowed  # b came back full; forgets a
    assert take("a").allowed


class Clock:
    def __init__(self, now=1_700_000_000_000):
        self.now = now

    def __call__(self):
        return self.now


def shield(clock, **kw):
    return _engine.Shield(clock=clock, **kw)


TAKE = _core.single("take", "k", 10, 1, 1, "default")


def test_an_outage_is_logged_once_at_its_start_and_its_end_and_probes_every_interval(caplog):
    clock = Clock()
    s = shield(clock, on_unavailable="local", instances=2, local_probe_ms=1000)
    assert s.before(TAKE) is None
    with caplog.at_level(logging.WARNING, logger="redis_tb"):
        d = s.failed(TAKE, LimiterUnavailable("ConnectionError: refused"))
        assert (d.source, d.remaining) == ("local", 4)
        for _ in range(3):
            assert s.before(TAKE).source == "local"  # nothing sent within the interval
        with pytest.raises(LimiterUnavailable):
            s.before(_core.single("refund", "k", 10, 1, 1, "default"))
        clock.now += 1000
        assert s.before(TAKE) is None  # one call probes
        assert s.before(TAKE).source == "local"  # the others do not
        assert s.failed(TAKE, LimiterUnavailable("again")).source == "local"
        clock.now += 1000
        assert s.before(TAKE) is None
        s.after(TAKE, Decision(True, 9, 0, 1000))
        assert s.before(TAKE) is None and not s.local.buckets
    assert [r.getMessage() for r in caplog.records] == [
        "redis-tb: Redis unreachable (ConnectionError: refused); limiting in process at 1/2 of each limit",
        "redis-tb: Redis reachable again; limits come from Redis",
    ]


def test_an_outage_sends_nothing_until_its_probe_time():
    outage = _local.Outage(probe_ms=1000, instances=1)
    assert outage.should_send(0)
    assert outage.failed("down", 0)  # starts it
    assert not outage.should_send(999)
    assert outage.should_send(1000)  # one probe
    assert not outage.should_send(1001)  # and only one
    assert not outage.failed("still down", 1002)  # goes on
    assert outage.succeeded() and not outage.succeeded()
    assert outage.should_send(1003)


def test_raise_mode_raises_and_keeps_no_outage():
    s = shield(Clock())
    with pytest.raises(LimiterUnavailable):
        s.failed(TAKE, LimiterUnavailable("down"))
    assert not s.outage.active and s.before(TAKE) is None


def test_a_wait_or_a_lease_is_not_answered_locally():
    s = shield(Clock(), on_unavailable="local")
    with pytest.raises(LimiterUnavailable):
        s.failed(TAKE, LimiterUnavailable("down"), plain=False)
    with pytest.raises(LimiterUnavailable):
        s.before(TAKE, plain=False)


def denied(retry, remaining=0, reset=5000, index=None):
    return Decision(False, remaining, retry, reset, index)


def test_the_denial_cache_answers_until_the_retry_time():
    clock = Clock()
    s = shield(clock, cache_denials=True)
    s.after(TAKE, denied(300, 0, 5000))
    d = s.before(TAKE)
    assert (d.allowed, d.retry_after_ms, d.reset_after_ms, d.source) == (False, 300, 5000, "cache")
    clock.now += 299
    d = s.before(TAKE)
    assert (d.retry_after_ms, d.reset_after_ms) == (1, 4701)
    clock.now += 1
    assert s.before(TAKE) is None and not s.denials.entries


def test_the_denial_cache_keeps_only_what_a_later_call_is_sure_to_meet():
    clock = Clock()
    s = shield(clock, cache_denials=True)
    two = _core.single("take", "k", 10, 1, 2, "default")
    s.after(two, denied(500))
    assert s.before(TAKE) is None  # fewer tokens than the denied call: to the server
    assert s.before(_core.single("take", "k", 10, 1, 3, "default")).source == "cache"
    assert s.before(TAKE.with_options(("MAXWAIT", "1000"))) is None
    assert s.before(_core.single("peek", "k", 10, 1, 2, "default")) is None
    s.after(_core.single("take", "never", 10, 1, 20, "default"), denied(-1))
    s.after(TAKE.with_options(("MAXWAIT", "100")), denied(700))
    assert set(s.denials.entries) == {"k"}


@pytest.mark.parametrize("op", ["refund", "charge", "unblock"])
def test_a_refund_charge_or_unblock_through_the_limiter_drops_the_entry(op):
    s = shield(Clock(), cache_denials=True)
    s.after(TAKE, denied(500))
    forget = _core.unblock("k") if op == "unblock" else _core.single(op, "k", 10, 1, 1, "default")
    assert s.before(forget) is None
    assert s.before(TAKE) is None


def test_in_take_all_any_cached_key_denies_with_its_index():
    s = shield(Clock(), cache_denials=True)
    limits = [Limit("a", 10, 1, 1, "sec"), Limit("b", 100, 1, 1, "day")]
    s.after(_core.take_all(limits), denied(900, index=1))
    d = s.before(_core.take_all(limits))
    assert (d.allowed, d.index, d.policy, d.source) == (False, 1, "day", "cache")
    assert s.before(_core.single("take", "b", 100, 1, 1, "day")).source == "cache"


def allowed(remaining, reset, capacity=10, rate=1):
    return Decision(True, remaining, 0, reset, None, capacity, rate)


@pytest.mark.parametrize("remaining,n,capacity,rate,reset,wait", [
    (0, 1, 10, 1, 9500, 501),  # 0.5 tokens left: 1 is back in 500 ms (+1: rounding)
    (0, 1, 10, 1, 9000, 0),  # exactly 1 token left: the next take is allowed
    (1, 1, 10, 1, 9000, 0),  # a whole token left
    (0, 1, 10, 3, 3001, 2),  # ceil(9 * 1000 / 3) = 3000: 1 is back a ms after the take
    (2, 3, 10, 2, 3600, 101),  # ceil(7 * 1000 / 2) = 3500
    (0, 0.5, 10, 1, 9300, 0),  # 0.7 left holds n = 0.5: nothing to remember
    (0, 1, 10, 1, -1, 0),  # no reset time
    (0, 1, 10, 0, 9500, 0),  # a bucket that does not refill
])
def test_an_allowed_take_that_left_fewer_than_n_waits_until_the_bucket_holds_n_again(
        remaining, n, capacity, rate, reset, wait):
    assert _local.primed_denial_ms(remaining, n, capacity, rate, reset) == wait


def test_an_allowed_take_that_left_fewer_than_n_is_remembered_as_the_next_denial():
    clock = Clock()
    s = shield(clock, cache_denials=True)
    s.after(TAKE, allowed(0, 9500))  # 0.5 tokens left: a take of 1 is denied for 500 ms (+1)
    d = s.before(TAKE)
    assert (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms, d.source) == (False, 0, 501, 9500, "cache")
    clock.now += 500
    assert (s.before(TAKE).retry_after_ms, s.before(TAKE).reset_after_ms) == (1, 9000)
    assert s.before(_core.single("take", "k", 10, 1, 0.5, "default")) is None  # a smaller take may pass
    clock.now += 1
    assert s.before(TAKE) is None and not s.denials.entries


def test_only_a_plain_take_that_left_fewer_than_n_is_remembered():
    s = shield(Clock(), cache_denials=True)
    s.after(TAKE, allowed(1, 9000))  # n left: the next take is allowed
    s.after(TAKE.with_options(("MAXWAIT", "1000")), allowed(0, 9500))  # a reservation
    s.after(TAKE.with_options(("BLOCK", "1000")), allowed(0, 9500))  # a lockout: the server locks
    s.after(_core.take_all([Limit("k", 10, 1)]), allowed(0, 9500))
    s.after(_core.single("peek", "k", 10, 1, 1, "default"), allowed(0, 9500))
    assert not s.denials.entries


def test_the_denial_cache_holds_local_max_keys():
    s = shield(Clock(), cache_denials=True, local_max_keys=2)
    for key in "abc":
        s.after(_core.single("take", key, 10, 1, 1, "default"), denied(500))
    assert list(s.denials.entries) == ["b", "c"]


@pytest.mark.parametrize("kw", [
    {"on_unavailable": "open"}, {"instances": 0}, {"instances": 1.5}, {"local_max_keys": 0},
    {"local_probe_ms": -1}, {"cache_denials": "yes"},
])
def test_bad_options_are_refused_when_the_limiter_is_made(kw):
    import redis

    from redis_tb import AsyncRateLimiter, RateLimiter

    with pytest.raises(InvalidArgument):
        RateLimiter(redis.Redis(port=1), **kw)
    with pytest.raises(InvalidArgument):
        AsyncRateLimiter(redis.asyncio.Redis(port=1), **kw)

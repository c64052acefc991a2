"""The synchronous API on every backend: module, Lua function, Lua script.

Rates are slow (0.001 tokens/s) so nothing refills between calls and the
figures are exact; reset_after_ms shrinks by the ms that pass between
calls, so it is compared to the second (as the headers show it)."""

from __future__ import annotations

from fractions import Fraction

import redis
import pytest

from redis_tb import Decision, InvalidArgument, Limit, LimiterReplyError, RateLimiter

SLOW = 0.001


def test_burst_then_denial(limiter):
    for left in (4, 3, 2, 1, 0):
        d = limiter.take("rl:burst", 5, SLOW)
        assert d.allowed and d.remaining == left and d.retry_after_ms == 0 and d.index is None
    d = limiter.take("rl:burst", 5, SLOW)
    assert not d.allowed and d.remaining == 0
    assert 999_000 < d.retry_after_ms <= 1_000_000
    assert 4_999_000 < d.reset_after_ms <= 5_000_000
    assert (d.capacity, d.rate, d.policy) == (5, SLOW, "default")
    assert d.headers() == {
        "RateLimit-Policy": '"default";q=5;w=5000',
        "RateLimit": '"default";r=0;t=5000',
        "Retry-After": "1000",
    }


def test_headers_on_allow_and_name(limiter):
    d = limiter.take("rl:named", 10, 2, 3, policy="api")
    assert d.allowed and d.remaining == 7
    assert d.headers() == {"RateLimit-Policy": '"api";q=10;w=5', "RateLimit": '"api";r=7;t=2'}


def test_peek_writes_nothing(limiter):
    d = limiter.peek("rl:peek", 5, SLOW, 2)
    assert d.allowed and d.remaining == 3 and d.reset_after_ms == 2_000_000
    assert not limiter.client.exists("rl:peek")
    limiter.take("rl:peek", 5, SLOW, 4)
    d = limiter.peek("rl:peek", 5, SLOW, 2)
    assert not d.allowed and d.remaining == 1 and 999_000 < d.retry_after_ms <= 1_000_000
    assert limiter.peek("rl:peek", 5, SLOW).remaining == 0  # n defaults to 1


def test_refund(limiter):
    limiter.take("rl:refund", 10, SLOW, 6)
    d = limiter.refund("rl:refund", 10, SLOW, 2)
    assert d.allowed and d.remaining == 6 and d.retry_after_ms == 0
    d = limiter.refund("rl:refund", 10, SLOW, 100)
    assert d.remaining == 10 and d.reset_after_ms == 0


def test_fractional_numbers(limiter):
    d = limiter.take("rl:frac", 2.5, 0.0005, 0.5)
    assert d.allowed and d.remaining == 2
    assert limiter.client.hget("rl:frac", "tokens") == b"2"
    d = limiter.take("rl:frac", 2.5, 0.0005, 1.75)
    assert d.allowed and d.remaining == 0
    assert d.headers()["RateLimit-Policy"] == '"default";q=2;w=5000'


def test_cost_above_capacity_never_succeeds(limiter):
    d = limiter.take("rl:big", 5, SLOW, 6)
    assert not d.allowed and d.retry_after_ms == -1 and d.remaining == 5
    assert d.retry_after is None and "Retry-After" not in d.headers()
    assert not limiter.client.exists("rl:big")


def test_take_all_allowed_and_denied(limiter):
    limits = [Limit("{u:1}:sec", 10, SLOW, 1, policy="sec"), Limit("{u:1}:day", 3, SLOW, 1, policy="day")]
    d = limiter.take_all(limits)
    assert d.allowed and d.index == 1 and d.remaining == 2 and d.policy == "day"
    assert d.headers() == {
        "RateLimit-Policy": '"sec";q=10;w=10000, "day";q=3;w=3000',
        "RateLimit": '"day";r=2;t=1000',
    }
    limiter.take_all(limits)
    limiter.take_all(limits)
    d = limiter.take_all(limits)
    assert not d.allowed and d.index == 1 and d.remaining == 0
    assert d.headers()["Retry-After"] == "1000"
    # the denied call took nothing from the other bucket
    assert limiter.peek("{u:1}:sec", 10, SLOW).remaining == 6


def test_take_all_default_names(limiter):
    d = limiter.take_all([Limit("{u:2}:a", 5, SLOW), Limit("{u:2}:b", 5, SLOW, 2)])
    assert d.index == 1 and d.policy == "limit1"
    assert d.headers()["RateLimit-Policy"] == '"limit0";q=5;w=5000, "limit1";q=5;w=5000'


def test_numbers_the_server_would_refuse_are_refused_before_sending(limiter):
    for args in [(0, 1), (5, 0), (5, -1), (5, 1, -1), (2**53 + 1, 1), (5, 1, 2**53 + 1), (1e30, 1), (5, 1, 1e30)]:
        with pytest.raises(InvalidArgument):
            limiter.take("rl:e", *args)
    with pytest.raises(InvalidArgument):
        limiter.take("", 5, 1)
    assert limiter.client.dbsize() == 0


def test_numbers_just_above_2_pow_53_are_refused_though_they_round_to_it(limiter):
    # 2^53 + 1/2 is the float 2^53, and the server refuses the text 9007199254740992.5.
    above = Fraction(2**54 + 1, 2)
    assert float(above) == 2**53
    for call in [lambda: limiter.take("rl:e", above, 1), lambda: limiter.take("rl:e", 5, 1, above),
                 lambda: limiter.charge(Limit("rl:e", 5, 1), 1, max_debt=above),
                 lambda: limiter.wait_take("rl:e", 5, 1, timeout_ms=above),
                 lambda: limiter.wait_take("rl:e", 5, 1, timeout_ms=2**53 + 1),
                 lambda: limiter.wait_acquire("rl:e", 1, 1000, timeout_ms=2**53 + 1)]:
        with pytest.raises(InvalidArgument, match=r"at most 9007199254740992 \(2\^53\)"):
            call()
    assert limiter.client.dbsize() == 0
    # 2^53 itself, as an int, a float or a Fraction, is sent.
    for bound in (2**53, float(2**53), Fraction(2**53)):
        assert limiter.peek("rl:e", bound, 1, bound).allowed


def test_server_errors_are_the_same_text(limiter):
    with pytest.raises(LimiterReplyError) as e:
        limiter.take_all([Limit("{d}a", 5, 1), Limit("{d}a", 5, 1)])
    assert e.value.message == "ERR each key may appear only once in TB.TAKEALL"
    limiter.client.set("rl:str", "x")
    with pytest.raises(LimiterReplyError, match="^WRONGTYPE Operation against a key"):
        limiter.take("rl:str", 5, 1)


def test_nan_and_inf_refused_before_sending(limiter):
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(InvalidArgument):
            limiter.take("rl:nan", bad, 1)
        with pytest.raises(InvalidArgument):
            limiter.take("rl:nan", 5, 1, bad)
    with pytest.raises(InvalidArgument):
        limiter.take("rl:nan", True, 1)
    with pytest.raises(ValueError):
        limiter.take("rl:nan", 5, 1, policy='bad\n"name')


def test_script_survives_script_flush(setup):
    """EVALSHA after SCRIPT FLUSH (NOSCRIPT) and FCALL after FUNCTION FLUSH recover."""
    server, arg, expected = setup
    with RateLimiter(redis.Redis(port=server.port), backend=arg) as lim:
        assert lim.take("rl:flush", 5, SLOW).remaining == 4
        with server.client() as r:
            r.execute_command("SCRIPT", "FLUSH")
            if expected == "function":
                r.execute_command("FUNCTION", "FLUSH")
        assert lim.take("rl:flush", 5, SLOW).remaining == 3


def scenario(lim: RateLimiter):
    """A fixed sequence of calls; the Decisions with reset rounded as the
    headers round it, and the headers."""
    out = []
    calls = [
        lambda: lim.take("s:a", 5, SLOW, 2),
        lambda: lim.take("s:a", 5, SLOW, 3),
        lambda: lim.take("s:a", 5, SLOW, 1),
        lambda: lim.peek("s:a", 5, SLOW),
        lambda: lim.refund("s:a", 5, SLOW, 2),
        lambda: lim.take("s:b", 3.5, 0.002, 0.25),
        lambda: lim.take("s:b", 3.5, 0.002, 9),
        lambda: lim.take_all([Limit("{s}1", 4, SLOW, 2, "x"), Limit("{s}2", 9, SLOW, 3, "y")]),
        lambda: lim.take_all([Limit("{s}1", 4, SLOW, 3, "x"), Limit("{s}2", 9, SLOW, 3, "y")]),
        lambda: lim.peek("s:new", 10, 1, 4),
    ]
    for call in calls:
        d = call()
        out.append((d.allowed, d.remaining, -(-d.retry_after_ms // 1000), -(-d.reset_after_ms // 1000),
                    d.index, d.policy, d.headers()))
    return out


def test_every_backend_answers_the_same(module_server, plain_server):
    results = {}
    for name, server, arg in (("module", module_server, "auto"), ("function", plain_server, "auto"),
                              ("script", plain_server, "script")):
        with server.client() as r:
            r.flushall()
        with RateLimiter(redis.Redis(port=server.port), backend=arg) as lim:
            results[name] = scenario(lim)
            assert lim.backend == name
    assert results["module"] == results["function"] == results["script"]
    assert results["module"][2][:3] == (False, 0, 1000)


def test_decision_headers_without_server():
    d = Decision(False, 0, 1001, 3999, capacity=20, rate=5, policy="x")
    assert d.headers() == {"RateLimit-Policy": '"x";q=20;w=4', "RateLimit": '"x";r=0;t=4', "Retry-After": "2"}
    assert Decision(True, 1, 0, 0, capacity=0.5, rate=3).headers()["RateLimit-Policy"] == '"default";q=0;w=1'
    assert Decision(True, 1, 0, 1, capacity=5, rate=1e-300).headers()["RateLimit-Policy"] == (
        '"default";q=5;w=999999999999999')


def test_peek_is_fcall_ro_on_the_function_backend(plain_server):
    """FCALL_RO, so that peek may run on a replica (docs/clients.md)."""
    with plain_server.client() as r:
        r.flushall()
        r.config_resetstat()
        with RateLimiter(redis.Redis(port=plain_server.port)) as lim:
            assert lim.peek("rl:ro", 5, SLOW).remaining == 4 and lim.backend == "function"
        stats = r.info("commandstats")
    assert stats["cmdstat_fcall_ro"]["calls"] == 1 and "cmdstat_fcall" not in stats

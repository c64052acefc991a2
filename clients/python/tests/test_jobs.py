"""Reservations, charges, settling and lockout (docs/clients.md#reservations-charges-and-lockout)
beyond the shared cases (clients/conformance/jobs.json): what each library
adds, on every backend (the Lua ones once lua/tb.lua has tb_charge)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aredis

from redis_tb import AsyncRateLimiter, InvalidArgument, Limit

from conftest import REPO, aclose

LUA_HAS_JOBS = "tb_charge" in (REPO / "lua" / "tb.lua").read_text(encoding="utf-8")


@pytest.fixture
def lim(limiter):
    if limiter.backend != "module" and not LUA_HAS_JOBS:
        pytest.skip("lua/tb.lua has no tb_charge yet")
    return limiter


def test_a_limit_checks_its_lockout_when_created():
    for bad in ({"block_ms": 0}, {"block_ms": 1.5}, {"block_ms": True}, {"max_block_ms": 5},
                {"block_ms": 10, "max_block_ms": 9}, {"block_ms": 2**53 + 1}):
        with pytest.raises(InvalidArgument):
            Limit("k", 1, 1, **bad)
    assert Limit("k", 1, 1, block_ms=10).lockout == ("BLOCK", "10")
    assert Limit("k", 1, 1, block_ms=10, max_block_ms=40).lockout == ("BLOCK", "10", "MAXBLOCK", "40")
    assert Limit("k", 1, 1).lockout == ()


def test_settle_of_equal_amounts_sends_nothing(limiter):
    sent = []
    real = limiter._execute
    limiter._execute = lambda step: sent.append(step) or real(step)
    assert limiter.settle(Limit("s:{x}", 5, 1), 3, 3) is None
    assert sent == []
    with pytest.raises(InvalidArgument):
        limiter.settle(Limit("s:{x}", 5, 1), 1, float("nan"))
    with pytest.raises(InvalidArgument):
        limiter.settle(("s:{x}", 5, 1), 1, 2)
    assert sent == []


def test_a_reservation_is_acted_on_after_its_wait(lim):
    assert lim.take("r:{a}", 1, 20).allowed
    d = lim.take("r:{a}", 1, 20, max_wait_ms=1000)
    assert d.allowed and d.remaining == 0 and 0 < d.wait_ms == d.retry_after_ms <= 50
    assert d.retry_after is None and "Retry-After" not in d.headers()


def test_take_limit_sends_the_limits_lockout_and_unblock_takes_a_limit(lim):
    limit = Limit("l:{a}", 1, 0.001, block_ms=60_000, policy="sec")
    assert lim.take_limit(limit).allowed
    d = lim.take_limit(limit)
    assert not d.allowed and d.policy == "sec"
    assert not lim.take("l:{a}", 1, 1000, 0).allowed  # locked: even n = 0, whatever the rate
    assert lim.unblock(limit) is True
    assert lim.unblock("l:{a}") is False


def test_wait_take_without_the_module_is_one_reservation_and_one_sleep(lim):
    started = time.monotonic()  # before the drain: the token is back 100 ms after it
    assert lim.take("w:{a}", 1, 10).allowed  # one token every 100 ms
    sent = []
    real = lim._execute
    lim._execute = lambda step: sent.append(step) or real(step)
    d = lim.wait_take("w:{a}", 1, 10, timeout_ms=5000)
    took = time.monotonic() - started
    assert d.allowed and d.retry_after_ms == 0 and 0.09 < took < 4.0, (d, took)
    if lim.backend != "module":
        commands = [step.args for step in sent if hasattr(step, "args")]
        assert len(commands) == 1 and commands[0][-2:] == ("MAXWAIT", "5000"), commands
        assert len([step for step in sent if type(step).__name__ == "Sleep"]) == 1


def test_the_async_limiter_has_the_same_calls(setup):
    server, arg, expected = setup
    if expected != "module" and not LUA_HAS_JOBS:
        pytest.skip("lua/tb.lua has no tb_charge yet")

    async def scenario():
        client = aredis.Redis(port=server.port)
        lim = AsyncRateLimiter(client, backend=arg)
        try:
            limit = Limit("a:{j}", 4, 0.001, block_ms=60_000)
            assert (await lim.take_limit(limit)).remaining == 3
            assert (await lim.settle(limit, 1, 3)).remaining == 1
            assert await lim.settle(limit, 2, 2) is None
            d = await lim.charge(limit, 10, max_debt=2)
            assert d.allowed and d.wait_ms > 0
            assert not (await lim.take_limit(limit)).allowed
            assert await lim.unblock(limit) is True
            d = await lim.take("a:{j}:r", 1, 20, max_wait_ms=0)
            assert d.allowed and d.wait_ms == 0
            assert (await lim.take_all([Limit("a:{j}:r", 1, 20)], max_wait_ms=500)).wait_ms > 0
            d = await lim.wait_take("a:{j}:r", 1, 20, timeout_ms=2000)
            assert d.allowed and d.retry_after_ms == 0
        finally:
            await lim.close()
            await aclose(client)

    asyncio.run(scenario())

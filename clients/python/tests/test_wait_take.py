"""wait_take: TB.BTAKE with the module (first come first served), a polling
loop with the Lua fallback (not FIFO); the same observable results."""

from __future__ import annotations

import threading
import time

import pytest

from test_api import SLOW


def test_waiter_is_served_when_tokens_come(limiter):
    started = time.monotonic()  # before the drain: the token is back 50 ms after it
    assert limiter.take("w:fast", 1, 20).allowed  # drained; one token every 50 ms
    d = limiter.wait_take("w:fast", 1, 20, timeout_ms=5000)
    took = time.monotonic() - started
    assert d.allowed and d.remaining == 0
    assert 0.04 < took < 4.0, took  # served by the token, well before the timeout


def test_times_out_with_a_denial(limiter):
    limiter.take("w:slow", 2, SLOW, 2)
    started = time.monotonic()
    d = limiter.wait_take("w:slow", 2, SLOW, timeout_ms=300)
    took = time.monotonic() - started
    assert not d.allowed and d.remaining == 0 and d.retry_after_ms > 900_000
    assert 0.25 < took < 5.0, took
    assert d.headers()["Retry-After"] == "1000"


def test_a_grant_counts_its_reset_from_when_it_is_served(limiter):
    # 10 tokens, 2/s, drained: the waiter is served when one token is back
    # (~500 ms), which it takes, so the bucket is full 5 s after the grant,
    # not 5.5 s after the wait began (what a reservation's reply says).
    started = time.monotonic()
    assert limiter.take("w:reset", 10, 2, 10).allowed
    d = limiter.wait_take("w:reset", 10, 2, timeout_ms=5000)
    took_ms = (time.monotonic() - started) * 1000
    assert d.allowed and d.retry_after_ms == 0
    # Served at most took_ms after the drain: at most 2 * took_ms / 1000 tokens
    # back, one taken, so full in at least 5500 - took_ms ms (1 ms of rounding).
    assert 5500 - took_ms - 1 <= d.reset_after_ms <= 5000, (d.reset_after_ms, took_ms)


def test_allowed_at_once_and_never(limiter):
    started = time.monotonic()
    d = limiter.wait_take("w:now", 3, SLOW, timeout_ms=10_000)
    assert d.allowed and d.remaining == 2 and time.monotonic() - started < 5.0  # not the timeout
    d = limiter.wait_take("w:now", 3, SLOW, 4, timeout_ms=10_000)
    assert not d.allowed and d.retry_after_ms == -1 and time.monotonic() - started < 5.0


def test_no_limit_waits_until_served(limiter):
    assert limiter.take("w:zero", 1, 10).allowed  # one token every 100 ms
    d = limiter.wait_take("w:zero", 1, 10, timeout_ms=0)
    assert d.allowed


def test_two_waiters_both_served(limiter):
    assert limiter.take("w:two", 1, 20).allowed
    results = []

    def wait():
        results.append(limiter.wait_take("w:two", 1, 20, timeout_ms=5000))

    threads = [threading.Thread(target=wait) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert [d.allowed for d in results] == [True, True]


def test_bad_timeout(limiter):
    with pytest.raises(ValueError):
        limiter.wait_take("w:bad", 1, 1, timeout_ms=-1)

"""Which backend runs is visible without configuring logging (issue 18
item 12): `limiter.backend` says it, and when "auto" finds no module the
Lua fallback is logged at WARNING, which Python prints to stderr even in an
app that configured no logging (logging.lastResort). The module, or a
backend the app forced, is an INFO line: quiet unless logging is set up.

The first two tests run a fresh interpreter, so that nothing (pytest's own
log capture included) has configured logging."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from redis_tb import RateLimiter

SYNC = """
    import redis, redis_tb
    limiter = redis_tb.RateLimiter(redis.Redis(port={port}))
    limiter.take("visible:k", 5, 1)
    print(limiter.backend)
"""
ASYNC = """
    import asyncio, redis.asyncio, redis_tb
    async def main():
        async with redis_tb.AsyncRateLimiter(redis.asyncio.Redis(port={port})) as limiter:
            await limiter.take("visible:k", 5, 1)
            print(limiter.backend)
    asyncio.run(main())
"""


def run_bare_python(code: str, port: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code.format(port=port))],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


@pytest.mark.parametrize("code", [SYNC, ASYNC], ids=["sync", "async"])
def test_the_lua_fallback_reaches_stderr_with_no_logging_configured(plain_server, code):
    done = run_bare_python(code, plain_server.port)
    assert done.stdout.strip() == "function"
    assert "redis-tb backend: function, the Lua fallback" in done.stderr
    assert "not first come first served" in done.stderr


@pytest.mark.parametrize("code", [SYNC, ASYNC], ids=["sync", "async"])
def test_the_module_choice_prints_nothing(module_server, code):
    done = run_bare_python(code, module_server.port)
    assert (done.stdout.strip(), done.stderr) == ("module", "")


def test_a_forced_lua_backend_is_an_info_line(plain_server, caplog):
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        with RateLimiter(plain_server.client(), backend="function") as limiter:
            limiter.take("visible:forced", 5, 1)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "redis_tb"]
    assert lines == [(logging.INFO, "redis-tb backend: function (forced; FUNCTION LOAD of lua/tb.lua)")]


def test_the_auto_fallback_is_a_warning_record(plain_server, caplog):
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        with RateLimiter(plain_server.client()) as limiter:
            limiter.take("visible:auto", 5, 1)
    warnings = [r.getMessage() for r in caplog.records if r.name == "redis_tb" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no TB.TAKE on the server" in warnings[0]

"""AsyncRateLimiter: the asyncio client on `redis.asyncio.Redis` / `RedisCluster`."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Optional, Sequence

import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from . import _core
from ._core import BLOCKING_MARGIN_S, Decision, Limit, Number, translate
from .limiter import DEFAULT_TIMEOUT, _Backend


class AsyncRateLimiter:
    """`RateLimiter` for asyncio: the same methods, awaited.

    timeout (default 0.2 s) bounds every call of the limiter, connect and
    retries included (`asyncio.wait_for`), whatever the client's own
    settings; a call that runs out raises `LimiterUnavailable`.
    """

    def __init__(self, client, backend: str = "auto", timeout: Optional[float] = DEFAULT_TIMEOUT):
        self._state = _Backend(backend)
        self.client = client
        self.timeout = timeout
        self._cluster = isinstance(client, AsyncRedisCluster)
        self._lock = asyncio.Lock()

    @property
    def backend(self) -> Optional[str]:
        """"module", "function" or "script"; None until the first call."""
        return self._state.chosen

    async def _bounded(self, coro, timeout: Optional[float] = None):
        timeout = self.timeout if timeout is None else timeout
        try:
            if timeout is None or timeout == math.inf:
                return await coro
            return await asyncio.wait_for(coro, timeout)
        except asyncio.TimeoutError:
            raise _core.LimiterUnavailable(f"TimeoutError: no reply within {timeout} s") from None

    async def connect(self) -> str:
        """Choose the backend now (and load the Lua code if needed)."""
        if self._state.chosen is not None:
            return self._state.chosen
        async with self._lock:
            if self._state.chosen is not None:
                return self._state.chosen
            try:
                return await self._bounded(self._choose(), None if self.timeout is None else self.timeout * 5)
            except rex.RedisError as e:
                raise translate(e) from e

    async def _on_all(self, *args):
        if self._cluster:
            await self.client.initialize()
            # explicit nodes: redis.asyncio routes FUNCTION LOAD by policy, not by the flag
            return await self.client.execute_command(*args, target_nodes=self.client.get_primaries())
        return await self.client.execute_command(*args)

    async def _load_function(self):
        await self._on_all("FUNCTION", "LOAD", "REPLACE", self._state.library)

    @contextlib.asynccontextmanager
    async def _connection(self, key: Optional[str] = None):
        """A connection of the pool (a cluster: of the key's node, or any
        node), closed if the command on it did not end with a reply."""
        if self._cluster:
            await self.client.initialize()  # once; loads the slot map
            node = self.client.get_node_from_key(key) if key else self.client.get_random_node()
            conn = node.acquire_connection()
        else:
            pool = self.client.connection_pool
            conn = await pool.get_connection()
        try:
            yield conn
        except rex.ResponseError:
            raise
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            if self._cluster:
                node.release(conn)
            else:
                await pool.release(conn)

    async def _raw(self, *args):
        """A command without redis-py's reply parsing (its COMMAND parser
        fails on the nil entry of an unknown command)."""
        async with self._connection() as conn:
            await conn.send_command(*args)
            return await conn.read_response()

    async def _choose(self) -> str:
        s = self._state
        if s.requested == "module":
            return s.announce("module", "forced")
        if s.requested == "function":
            await self._load_function()
            return s.announce("function", "forced; FUNCTION LOAD tb done")
        if s.requested == "script":
            await self._on_all("SCRIPT", "LOAD", s.script)
            return s.announce("script", "forced; SCRIPT LOAD done")
        info = await self._raw("COMMAND", "INFO", "tb.take")
        if _core.module_present(info):
            return s.announce("module", "the server has TB.TAKE")
        try:
            await self._load_function()
        except rex.ResponseError as e:
            await self._on_all("SCRIPT", "LOAD", s.script)
            return s.announce(
                "script",
                f"no TB.TAKE; FUNCTION LOAD failed ({_core.reply_text(e)}); EVALSHA of lua/tb.lua",
            )
        return s.announce("function", "no TB.TAKE on the server; FUNCTION LOAD of lua/tb.lua")

    async def _send(self, backend: str, call: _core.Call):
        try:
            return await self.client.execute_command(*_core.command(backend, call, self._state.sha))
        except rex.NoScriptError:
            return await self.client.execute_command(*_core.eval_command(call, self._state.script))
        except rex.ResponseError as e:
            if backend != "function" or "Function not found" not in str(e):
                raise
            await self._load_function()
            return await self.client.execute_command(*_core.command(backend, call, self._state.sha))

    async def _run(self, call: _core.Call) -> Decision:
        backend = await self.connect()
        try:
            reply = await self._bounded(self._send(backend, call))
        except rex.RedisError as e:
            raise translate(e) from e
        return _core.decision(call, reply)

    async def take(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, name: str = "default") -> Decision:
        return await self._run(_core.single("take", key, capacity, rate, n, name))

    async def peek(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, name: str = "default") -> Decision:
        return await self._run(_core.single("peek", key, capacity, rate, n, name))

    async def refund(self, key: str, capacity: Number, rate: Number, n: Number, *, name: str = "default") -> Decision:
        return await self._run(_core.single("refund", key, capacity, rate, n, name))

    async def take_all(self, limits: Sequence[Limit]) -> Decision:
        return await self._run(_core.take_all(limits))

    async def wait_take(
        self,
        key: str,
        capacity: Number,
        rate: Number,
        n: Number = 1,
        *,
        timeout_ms: Number,
        name: str = "default",
    ) -> Decision:
        """See `RateLimiter.wait_take`: TB.BTAKE with the module (FIFO), a
        polling loop with the Lua fallback (NOT FIFO)."""
        timeout_ms = _core.check_timeout_ms(timeout_ms)
        call = _core.single("take", key, capacity, rate, n, name)
        backend = await self.connect()
        if backend == "module":
            cmd = _core.btake_command(key, call.numbers[0], timeout_ms)
            try:
                reply = await self._btake(key, cmd, timeout_ms)
            except rex.RedisError as e:
                raise translate(e) from e
            return _core.decision(call, reply)
        deadline = None if timeout_ms == 0 else time.monotonic() + timeout_ms / 1000
        while True:
            d = await self._run(call)
            if d.allowed or d.retry_after_ms < 0:
                return d
            pause = max(d.retry_after_ms, 1) / 1000
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return d
                pause = min(pause, left)
            await asyncio.sleep(pause)

    async def _btake(self, key: str, cmd: list, timeout_ms: int):
        """TB.BTAKE on a connection of its own, read with a timeout of
        timeout_ms + BLOCKING_MARGIN_S (none for timeout_ms=0)."""
        wait = math.inf if timeout_ms == 0 else timeout_ms / 1000 + BLOCKING_MARGIN_S
        async with self._connection(key) as conn:
            await self._bounded(conn.send_command(*cmd))
            try:
                return await conn.read_response(timeout=wait)
            except asyncio.TimeoutError:
                raise rex.TimeoutError(f"no TB.BTAKE reply within {wait} s") from None


__all__ = ["AsyncRateLimiter"]

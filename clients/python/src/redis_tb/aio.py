"""AsyncRateLimiter: the asyncio driver on `redis.asyncio.Redis` / `RedisCluster`.

It only does I/O: every decision is `_engine`'s, shared with `RateLimiter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from time import perf_counter
from typing import List, Optional, Sequence

import redis.asyncio as aredis
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry

from . import _core, _engine, _metrics
from ._core import Decision, Lease, Limit, LimiterUnavailable, Number, TopKey
from ._lease import AsyncLeaseGuard
from .limiter import DEFAULT_TIMEOUT, fast_failing_kwargs, get_connection_args


def async_limiter_client(client, timeout: Optional[float]):
    """For a standalone `redis.asyncio.Redis`: a client of its own on the
    same settings that fails fast (see `fast_failing_kwargs`: a refused
    connection fails at once instead of backing off until the timeout).
    A cluster client, or `timeout=None`: the client as it is."""
    if timeout is None or isinstance(client, AsyncRedisCluster):
        return client
    pool = client.connection_pool
    own = aredis.ConnectionPool(
        connection_class=pool.connection_class,
        max_connections=pool.max_connections,
        # Each command is bounded by asyncio.timeout / wait_for (timeout, or longer
        # while detecting the backend), so the socket's own read timeout is
        # only the longest of these.
        **fast_failing_kwargs(pool.connection_kwargs, timeout, AsyncRetry,
                              read_timeout=timeout * _engine.DETECTION_TIMEOUT_FACTOR),
    )
    return aredis.Redis(connection_pool=own)


# Python 3.11+: asyncio.timeout bounds the command in the calling task;
# asyncio.wait_for (before 3.12) runs it in a task of its own, about 15 us
# more per call (bench/middleware/breakdown.py).
_timeout = getattr(asyncio, "timeout", None)


class AsyncRateLimiter:
    """`RateLimiter` for asyncio: the same methods, awaited.

    timeout (default 0.2 s) bounds each command of the limiter
    (`asyncio.timeout`, `asyncio.wait_for` before Python 3.11), whatever the
    client's own settings; a command
    that runs out raises `LimiterUnavailable`. On a standalone client the
    limiter uses a pool of its own with the same settings, which fails fast.

    The other options (on_unavailable, instances, local_max_keys,
    local_probe_ms, cache_denials, module_recheck_ms, meter_provider) are
    `RateLimiter`'s.

    `await close()` (or leaving an ``async with`` block) closes every
    connection the limiter opened; the client you passed stays yours.
    """

    def __init__(self, client, backend: str = "auto", timeout: Optional[float] = DEFAULT_TIMEOUT, *,
                 on_unavailable: str = "raise", instances: int = 1, local_max_keys: int = 10_000,
                 local_probe_ms: int = 1_000, cache_denials: bool = False,
                 module_recheck_ms: int = _engine.MODULE_RECHECK_MS, meter_provider=None):
        self._state = _engine.BackendState(backend, module_recheck_ms)
        self._shield = _engine.Shield(on_unavailable, instances, local_max_keys, local_probe_ms, cache_denials)
        self._metrics = _metrics.Metrics(meter_provider)
        self.timeout = timeout
        self._cluster = isinstance(client, AsyncRedisCluster)
        self._own_client = timeout is not None and not self._cluster
        self.client = async_limiter_client(client, timeout)
        self._blocking = weakref.WeakSet()

    @property
    def backend(self) -> Optional[str]:
        """"module", "function" or "script"; None until a call reached the server."""
        return self._state.chosen

    # --- I/O: the only thing this class does ------------------------------

    async def _bounded(self, coro, factor: float = 1):
        if self.timeout is None:
            return await coro
        limit = self.timeout * factor
        try:
            if _timeout is not None:
                async with _timeout(limit):
                    return await coro
            return await asyncio.wait_for(coro, limit)
        except asyncio.TimeoutError:
            raise rex.TimeoutError(f"no reply within {limit} s") from None

    async def _execute(self, step):
        if isinstance(step, _engine.Send):
            factor = _engine.DETECTION_TIMEOUT_FACTOR if step.detecting else 1
            if step.route == _engine.RAW:
                return await self._bounded(self._raw(*step.args), factor)
            if step.route == _engine.EVERY_PRIMARY:
                return await self._every_primary(*step.args)
            if step.route == _engine.PRIMARIES and self._cluster:
                await self._bounded(self.client.initialize(), factor)
                # explicit nodes: redis.asyncio routes FUNCTION LOAD by policy, not by the flag
                nodes = self.client.get_primaries()
                return await self._bounded(self.client.execute_command(*step.args, target_nodes=nodes), factor)
            return await self._bounded(self.client.execute_command(*step.args), factor)
        if isinstance(step, _engine.Block):
            return await self._block(step)
        if isinstance(step, _engine.Sleep):
            return await asyncio.sleep(step.seconds)
        raise TypeError(f"unknown step {step!r}")

    async def _connection(self, key: Optional[str] = None, node=None):
        """(connection, release) from the pool: a cluster's of the node that
        owns `key`, of `node`, or of any node."""
        if not self._cluster:
            pool = self.client.connection_pool
            conn = await pool.get_connection(*get_connection_args(pool))
            return conn, lambda: pool.release(conn)
        await self._bounded(self.client.initialize())  # once; loads the slot map
        if node is not None:
            target = self.client.get_node(host=node[0], port=node[1])
            if target is None:  # a node the slot map does not know yet
                await self._bounded(self.client.nodes_manager.initialize())
                target = self.client.get_node(host=node[0], port=node[1])
            if target is None:
                raise rex.ConnectionError(f"redirected to unknown node {node[0]}:{node[1]}")
        else:
            target = self.client.get_node_from_key(key) if key else self.client.get_random_node()
        return _node_connection(target)

    async def _raw(self, *args):
        """A command without redis-py's reply parsing (its COMMAND parser
        fails on the nil entry of an unknown command)."""
        conn, release = await self._connection()
        async with _borrowed(conn, release):
            await conn.send_command(*args)
            return await conn.read_response()

    async def _every_primary(self, *args) -> list:
        """The command on the server, or on each primary of a cluster, each
        reply as the server sent it (bytes stay bytes whatever the client
        decodes), each node's exchange bounded by the timeout."""
        if self._cluster:
            await self._bounded(self.client.initialize())
            targets = self.client.get_primaries()
        else:
            targets = [None]
        replies = []
        for target in targets:
            replies.append(await self._bounded(self._unparsed(target, args)))
        return replies

    async def _unparsed(self, target, args):
        conn, release = await self._connection() if target is None else _node_connection(target)
        async with _borrowed(conn, release):
            await conn.send_command(*args)
            return await conn.read_response(disable_decoding=True)

    async def _block(self, step: _engine.Block):
        """A blocking command on a pooled connection of its own: one per
        wait in progress (a blocked connection can carry nothing else)."""
        conn, release = await self._connection(step.key, step.node)
        self._blocking.add(conn)
        async with _borrowed(conn, release):
            if step.asking:
                await self._bounded(conn.send_command("ASKING"))
                await self._bounded(conn.read_response())
            await self._bounded(conn.send_command(*step.args))
            try:
                return await conn.read_response(timeout=math.inf if step.wait_s is None else step.wait_s)
            except asyncio.TimeoutError:
                raise rex.TimeoutError(f"no {step.args[0]} reply within {step.wait_s} s") from None

    # --- the API -----------------------------------------------------------

    async def connect(self) -> str:
        """Detect the backend now (and load the Lua code if needed); raises
        LimiterUnavailable if the server cannot be reached."""
        return await _engine.adrive(_engine._translated(_engine.ensure(self._state)), self._execute)

    @property
    def on_unavailable(self) -> str:
        return self._shield.on_unavailable

    async def _run(self, call: _core.Call, operation=_engine.run, *args):
        """`_answer`, counted in the limiter's metrics."""
        metrics = self._metrics
        if not metrics.enabled:
            return await self._answer(call, operation, *args)
        started = perf_counter()
        result = await self._answer(call, operation, *args)
        metrics.answered(call, result, started, operation is not _engine.run)
        return result

    async def _answer(self, call: _core.Call, operation=_engine.run, *args):
        """See `RateLimiter._answer`: the shield (denial cache, local limiter) first."""
        shield, plain = self._shield, operation is _engine.run
        answer = shield.before(call, plain)
        if answer is not None:
            return answer
        try:
            result = await _engine.adrive(operation(self._state, call, *args), self._execute)
        except LimiterUnavailable as e:
            return shield.failed(call, e, plain)
        shield.after(call, result, plain)
        return result

    async def _leased(self, call: _core.Call, fail_open: bool, operation=_engine.run, *args) -> Lease:
        """See `RateLimiter._leased`."""
        try:
            return await self._run(call, operation, *args)
        except LimiterUnavailable:
            if not fail_open:
                raise
            lease = _core.failed_open_lease(call)
            if self._metrics.enabled:
                self._metrics.answered(call, lease, 0.0, False)
            return lease

    async def take(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, policy: str = "default",
                   max_wait_ms: Optional[int] = None, block_ms: Optional[int] = None,
                   max_block_ms: Optional[int] = None) -> Decision:
        """See `RateLimiter.take` (reservations, lockout)."""
        return await self._run(_core.take(key, capacity, rate, n, policy, max_wait_ms, block_ms, max_block_ms))

    async def peek(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, policy: str = "default") -> Decision:
        return await self._run(_core.single("peek", key, capacity, rate, n, policy))

    async def refund(self, key: str, capacity: Number, rate: Number, n: Number, *, policy: str = "default") -> Decision:
        return await self._run(_core.single("refund", key, capacity, rate, n, policy))

    async def take_all(self, limits: Sequence[Limit], *, max_wait_ms: Optional[int] = None) -> Decision:
        return await self._run(_core.take_all(limits, max_wait_ms))

    async def take_limit(self, limit: Limit, *, max_wait_ms: Optional[int] = None) -> Decision:
        """See `RateLimiter.take_limit`."""
        return await self._run(_core.limit_take(limit, max_wait_ms))

    async def charge(self, limit: Limit, n: Number, *, max_debt: Optional[Number] = None) -> Decision:
        """See `RateLimiter.charge`."""
        return await self._run(_core.charge(limit, n, max_debt))

    async def settle(self, limit: Limit, reserved: Number, actual: Number) -> Optional[Decision]:
        """See `RateLimiter.settle`: a refund, a charge, or None without a call."""
        call = _core.settle(limit, reserved, actual)
        return None if call is None else await self._run(call)

    async def unblock(self, limit_or_key) -> bool:
        """See `RateLimiter.unblock`."""
        return await self._run(_core.unblock(limit_or_key))

    async def wait_take(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, timeout_ms: Number,
                        policy: str = "default") -> Decision:
        """See `RateLimiter.wait_take`: TB.BTAKE on the key's node with the
        module, one reservation and one sleep with the Lua fallback (both FIFO)."""
        call = _core.single("take", key, capacity, rate, n, policy)
        timeout_ms = _core.check_timeout_ms(timeout_ms)  # after the numbers, as the server checks them
        return await self._run(call, _engine.wait_take, timeout_ms)

    # --- concurrency limits: see RateLimiter.acquire and docs/leases.md -----

    async def acquire(self, key: str, limit: int, lease_ms: int, *, policy: str = "default",
                      fail_open: bool = False) -> Lease:
        call = _core.acquire(key, limit, lease_ms, policy)
        return await self._leased(call, fail_open)

    async def release(self, key: str, lease) -> bool:
        ident = _core.lease_id(lease)
        if ident is None:
            _core.check_key(key)
            return False
        return await self._run(_core.release(key, ident))

    async def renew(self, key: str, lease, lease_ms: int) -> bool:
        ident = _core.lease_id(lease)
        call = _core.renew(key, ident or "-", lease_ms)
        if ident is None:
            return False
        return await self._run(call)

    async def wait_acquire(self, key: str, limit: int, lease_ms: int, *, timeout_ms: Number,
                           policy: str = "default", fail_open: bool = False,
                           poll_ms: Number = _engine.LEASE_POLL_S * 1000) -> Lease:
        """See `RateLimiter.wait_acquire`: TB.ACQUIRE with timeout_ms on the
        key's node with the module (FIFO), polling with the Lua fallback (NOT FIFO)."""
        call = _core.acquire(key, limit, lease_ms, policy)
        timeout_ms = _core.check_timeout_ms(timeout_ms)  # after limit and lease_ms, as the server checks them
        poll_s = _core.check_timeout_ms(poll_ms) / 1000 or 0.001
        return await self._leased(call, fail_open, _engine.wait_acquire, timeout_ms, poll_s)

    def lease(self, key: str, limit: int, lease_ms: int, *, timeout_ms: Optional[Number] = None,
              policy: str = "default", fail_open: bool = False,
              renew_every_ms: Optional[Number] = None) -> AsyncLeaseGuard:
        """``async with limiter.lease(key, limit, lease_ms) as guard:``; see `RateLimiter.lease`."""
        return AsyncLeaseGuard(self, key, limit, lease_ms, timeout_ms=timeout_ms, policy=policy,
                               fail_open=fail_open, renew_every_ms=renew_every_ms)

    async def top(self, count: int = 10) -> List[TopKey]:
        """See `RateLimiter.top`: TB.TOP on the server or on every primary, merged."""
        return await _engine.adrive(_engine.top(count), self._execute)

    async def close(self):
        """Close every connection the limiter opened: its own pool (a
        standalone client), and the connections it used for waits on a
        cluster's nodes. The client you passed stays open."""
        if self._own_client:
            await self.client.connection_pool.disconnect()
        conns, self._blocking = list(self._blocking), weakref.WeakSet()
        for conn in conns:
            await conn.disconnect()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


def _node_connection(target):
    """(connection, release) from a cluster node's own pool."""
    conn = target.acquire_connection()
    if hasattr(target, "release"):
        return conn, lambda: target.release(conn)
    return conn, lambda: target._free.append(conn)  # redis-py < 5.1 has no release()


async def _maybe_await(value):
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        await value


@contextlib.asynccontextmanager
async def _borrowed(conn, release):
    """`limiter.borrowed` for asyncio: `release()` (from `_connection`)
    gives `conn` back at the end, closed first if it failed in any way but
    an error reply (a reply it still owes would answer the next command)."""
    try:
        yield conn
    except rex.ResponseError:
        raise
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await _maybe_await(release())


__all__ = ["AsyncRateLimiter", "async_limiter_client"]

"""RateLimiter: the synchronous driver on redis-py `Redis` / `RedisCluster`.

It only does I/O: every decision (backend, failure rule, retries, waiting)
is `_engine`'s, shared with `AsyncRateLimiter`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
import weakref
from time import perf_counter
from typing import List, Optional, Sequence

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from . import _core, _engine, _metrics
from ._core import Decision, Lease, Limit, LimiterError, LimiterUnavailable, Number, TopKey
from ._lease import LeaseGuard

log = logging.getLogger("redis_tb")

DEFAULT_TIMEOUT = 0.2


def _is_cluster(client) -> bool:
    return isinstance(client, RedisCluster)


def fast_failing_kwargs(connection_kwargs: dict, timeout: float, retry_class=Retry, read_timeout=None) -> dict:
    """A pool's connection settings with `timeout` for connect and for each
    command, and no retry of redis-py's own: the limiter retries a call
    once itself, on a dropped connection only, never after a timeout nor
    for a refund (`_engine.adrive`, docs/clients.md#a-dropped-connection-is-not-an-outage).
    redis-py's defaults (5 s, and from 6.0 three retries with back-off that
    also retry timeouts) would hold each request for seconds when the server
    hangs, and send a refund twice.
    `retry_class`: redis.asyncio.retry.Retry for an asyncio pool;
    `read_timeout`: the socket's, if not `timeout`."""
    kwargs = dict(connection_kwargs)
    kwargs.update(
        socket_timeout=timeout if read_timeout is None else read_timeout,
        socket_connect_timeout=timeout,
        retry=retry_class(NoBackoff(), 0),
        retry_on_error=[],
    )
    kwargs.pop("retry_on_timeout", None)
    return kwargs


def limiter_client(client, timeout: Optional[float]):
    """For a standalone `Redis`: a client of its own on the same server and
    settings (auth, db, TLS, ...), see `fast_failing_kwargs`. `timeout=None`:
    the client as is. A `RedisCluster` is used as it is (README: give it
    short timeouts)."""
    if timeout is None or _is_cluster(client):
        return client
    pool = client.connection_pool
    own = redis.ConnectionPool(
        connection_class=pool.connection_class,
        max_connections=pool.max_connections,
        **fast_failing_kwargs(pool.connection_kwargs, timeout),
    )
    return redis.Redis(connection_pool=own)


def get_connection_args(pool) -> tuple:
    """The arguments of `pool.get_connection(...)` (sync or async):
    redis-py < 5.3 requires a command name, later versions deprecate it."""
    param = inspect.signature(pool.get_connection).parameters.get("command_name")
    return ("_",) if param is not None and param.default is inspect.Parameter.empty else ()


def pool_connection(pool):
    return pool.get_connection(*get_connection_args(pool))


@contextlib.contextmanager
def borrowed(pool, conn):
    """Gives `conn` back to `pool` at the end. A connection that failed in
    any way but an error reply is closed first: a reply it still owes
    would be read as the answer to the next command sent on it."""
    try:
        yield conn
    except rex.ResponseError:
        raise
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


class RateLimiter:
    """Token buckets on a redis-py `Redis` or `RedisCluster`.

    backend: "auto" (default: the module if the server has TB.TAKE, else
    the Lua library via FUNCTION LOAD, else the Lua script via EVALSHA), or
    "module" / "function" / "script" to force one. Detected on the first
    call that reaches the server, and again when the server changes under
    the limiter (docs/clients.md#the-failure-rule).

    timeout: seconds for connect and for each command (default 0.2); see
    `limiter_client`. Errors follow the one failure rule:
    `LimiterUnavailable` (the server could not answer),
    `LimiterReplyError` / `LimiterError` (a bug), `InvalidArgument` (before
    sending).

    on_unavailable: "raise" (default: an unreachable Redis raises
    LimiterUnavailable) or "local": take, take_limit, take_all and peek are
    answered by a local limiter at 1/`instances` of each limit, in an LRU of
    `local_max_keys` buckets, trying Redis again every `local_probe_ms`
    (docs/clients.md#when-redis-is-down-the-local-limiter).
    cache_denials: remember each denial until its retry time and answer
    takes on that key in process meanwhile (docs/clients.md#the-denial-cache).
    module_recheck_ms: on Lua after the module went away, how often to
    look for it again.
    meter_provider: the OpenTelemetry MeterProvider its metrics go to
    (docs/clients.md#metrics; default: the global one; without
    opentelemetry-api installed, none are recorded).
    A call whose connection dropped (a restart) is sent once more (not a
    refund or a settle); `decision.source` says where an answer came from.

    `close()` (or leaving a ``with`` block) closes every connection the
    limiter opened; the client you passed stays yours.
    """

    def __init__(self, client, backend: str = "auto", timeout: Optional[float] = DEFAULT_TIMEOUT, *,
                 on_unavailable: str = "raise", instances: int = 1, local_max_keys: int = 10_000,
                 local_probe_ms: int = 1_000, cache_denials: bool = False,
                 module_recheck_ms: int = _engine.MODULE_RECHECK_MS, meter_provider=None):
        self._state = _engine.BackendState(backend, module_recheck_ms)
        self._shield = _engine.Shield(on_unavailable, instances, local_max_keys, local_probe_ms, cache_denials)
        self._metrics = _metrics.Metrics(meter_provider)
        self.timeout = timeout
        self._own_client = timeout is not None and not _is_cluster(client)
        self.client = limiter_client(client, timeout)
        self._cluster = _is_cluster(self.client)
        # Connections this limiter took from a cluster client's pools for
        # blocking waits: close() disconnects them (they stay in the pools).
        self._blocking = weakref.WeakSet()
        self._blocking_lock = threading.Lock()
        if self._cluster and timeout is not None:
            own = self.client.nodes_manager.connection_kwargs.get("socket_timeout")
            if own is None or own > timeout:
                log.warning(
                    "redis-tb: this RedisCluster has socket_timeout=%r; the limiter uses it as "
                    "it is (create it with socket_timeout=socket_connect_timeout=%r to fail fast)",
                    own,
                    timeout,
                )

    @property
    def backend(self) -> Optional[str]:
        """"module", "function" or "script"; None until a call reached the server."""
        return self._state.chosen

    # --- I/O: the only thing this class does ------------------------------

    def _execute(self, step):
        if isinstance(step, _engine.Send):
            if step.route == _engine.RAW:
                return self._raw(*step.args)
            if step.route == _engine.EVERY_PRIMARY:
                return self._every_primary(*step.args)
            if step.route == _engine.PRIMARIES and self._cluster:
                return self.client.execute_command(*step.args, target_nodes=RedisCluster.PRIMARIES)
            return self.client.execute_command(*step.args)
        if isinstance(step, _engine.Block):
            return self._block(step)
        if isinstance(step, _engine.Sleep):
            return time.sleep(step.seconds)
        raise TypeError(f"unknown step {step!r}")

    def _pool(self, key: Optional[str] = None, node=None):
        if not self._cluster:
            return self.client.connection_pool
        if node is not None:
            found = self.client.get_node(host=node[0], port=node[1])
            if found is None:  # a node the slot map does not know yet
                self.client.nodes_manager.initialize()
                found = self.client.get_node(host=node[0], port=node[1])
            if found is None:
                raise rex.ConnectionError(f"redirected to unknown node {node[0]}:{node[1]}")
            return found.redis_connection.connection_pool
        target = self.client.get_node_from_key(key) if key else self.client.get_random_node()
        return target.redis_connection.connection_pool

    def _raw(self, *args):
        """A command without redis-py's reply parsing (its COMMAND parser
        fails on the nil entry of an unknown command)."""
        pool = self._pool()
        with borrowed(pool, pool_connection(pool)) as conn:
            conn.send_command(*args)
            return conn.read_response()

    def _every_primary(self, *args) -> list:
        """The command on the server, or on each primary of a cluster, each
        reply as the server sent it: bytes stay bytes whatever the client
        decodes (a key need not be UTF-8)."""
        if self._cluster:
            pools = [node.redis_connection.connection_pool for node in self.client.get_primaries()]
        else:
            pools = [self.client.connection_pool]
        replies = []
        for pool in pools:
            with borrowed(pool, pool_connection(pool)) as conn:
                conn.send_command(*args)
                replies.append(conn.read_response(disable_decoding=True))
        return replies

    def _block(self, step: _engine.Block):
        """A blocking command on a pooled connection of its own: one per
        wait in progress (a blocked connection can carry nothing else)."""
        pool = self._pool(step.key, step.node)
        conn = pool_connection(pool)
        if self._cluster:
            with self._blocking_lock:
                self._blocking.add(conn)
        with borrowed(pool, conn):
            if step.asking:
                conn.send_command("ASKING")
                conn.read_response()
            conn.send_command(*step.args)
            if not conn.can_read(timeout=step.wait_s):
                raise rex.TimeoutError(f"no {step.args[0]} reply within {step.wait_s} s")
            return conn.read_response()

    # --- the API -----------------------------------------------------------

    def connect(self) -> str:
        """Detect the backend now (and load the Lua code if needed); raises
        LimiterUnavailable if the server cannot be reached."""
        return _engine.drive(_engine._translated(_engine.ensure(self._state)), self._execute)

    @property
    def on_unavailable(self) -> str:
        return self._shield.on_unavailable

    def _run(self, call: _core.Call, operation=_engine.run, *args):
        """`_answer`, counted in the limiter's metrics."""
        metrics = self._metrics
        if not metrics.enabled:
            return self._answer(call, operation, *args)
        started = perf_counter()
        result = self._answer(call, operation, *args)
        metrics.answered(call, result, started, operation is not _engine.run)
        return result

    def _answer(self, call: _core.Call, operation=_engine.run, *args):
        """`operation(state, call, *args)` (an `_engine` generator), unless
        the denial cache or the local limiter answers it without Redis
        (only a plain call, `_engine.run`: a wait is never answered so)."""
        shield, plain = self._shield, operation is _engine.run
        answer = shield.before(call, plain)
        if answer is not None:
            return answer
        try:
            result = _engine.drive(operation(self._state, call, *args), self._execute)
        except LimiterUnavailable as e:
            return shield.failed(call, e, plain)
        shield.after(call, result, plain)
        return result

    def _leased(self, call: _core.Call, fail_open: bool, operation=_engine.run, *args) -> Lease:
        """An acquire; `fail_open`: an unavailable limiter answers a
        failed-open Lease (acquired, no id) instead of raising."""
        try:
            return self._run(call, operation, *args)
        except LimiterUnavailable:
            if not fail_open:
                raise
            lease = _core.failed_open_lease(call)
            if self._metrics.enabled:
                self._metrics.answered(call, lease, 0.0, False)
            return lease

    def take(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, policy: str = "default",
             max_wait_ms: Optional[int] = None, block_ms: Optional[int] = None,
             max_block_ms: Optional[int] = None) -> Decision:
        """Take n tokens from the bucket `key` (burst `capacity`, `rate`/s).

        max_wait_ms: a reservation (MAXWAIT): allowed into debt when the
        tokens arrive within that many ms; then `decision.wait_ms` (its
        retry_after_ms) is how long to wait before acting.
        block_ms / max_block_ms: lockout (BLOCK/MAXBLOCK): a denial locks
        the key for block_ms, doubling within a probation up to
        max_block_ms; every take and peek is denied while it holds."""
        return self._run(_core.take(key, capacity, rate, n, policy, max_wait_ms, block_ms, max_block_ms))

    def peek(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, policy: str = "default") -> Decision:
        """What `take` would answer now; writes nothing."""
        return self._run(_core.single("peek", key, capacity, rate, n, policy))

    def refund(self, key: str, capacity: Number, rate: Number, n: Number, *, policy: str = "default") -> Decision:
        """Give n tokens back (capped at capacity)."""
        return self._run(_core.single("refund", key, capacity, rate, n, policy))

    def take_all(self, limits: Sequence[Limit], *, max_wait_ms: Optional[int] = None) -> Decision:
        """All limits or none; the Decision is the deciding limit's, `index` its position.
        max_wait_ms: a reservation on every bucket (see `take`); the limits'
        block_ms/max_block_ms (which must be the same) are sent as BLOCK/MAXBLOCK."""
        return self._run(_core.take_all(limits, max_wait_ms))

    def take_limit(self, limit: Limit, *, max_wait_ms: Optional[int] = None) -> Decision:
        """`take` of one Limit: its key, capacity, rate, n, policy and lockout."""
        return self._run(_core.limit_take(limit, max_wait_ms))

    def charge(self, limit: Limit, n: Number, *, max_debt: Optional[Number] = None) -> Decision:
        """TB.CHARGE: a cost learned after the work, always taken, into debt
        down to -max_debt (default: the capacity). `decision.wait_ms` is the
        wait until the debt is repaid (later takes are denied until then)."""
        return self._run(_core.charge(limit, n, max_debt))

    def settle(self, limit: Limit, reserved: Number, actual: Number) -> Optional[Decision]:
        """After a take of `reserved` for work that cost `actual`: refund
        the difference (actual < reserved) or charge it (actual > reserved),
        in one call; None, with no call, when they are equal."""
        call = _core.settle(limit, reserved, actual)
        return None if call is None else self._run(call)

    def unblock(self, limit_or_key) -> bool:
        """TB.UNBLOCK: end the key's lock and forget its strikes; True if
        there was a lock or a strike to forget."""
        return self._run(_core.unblock(limit_or_key))

    def wait_take(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, timeout_ms: Number,
                  policy: str = "default") -> Decision:
        """Take n tokens, waiting up to timeout_ms (0: no limit) for them.

        Module: TB.BTAKE on the node that owns the key, served first come
        first served by the server. Lua fallback: ONE reservation (TB.TAKE's
        MAXWAIT timeout_ms) and one sleep for the delay it returns, first
        come first served too (reservations queue in the bucket's debt).
        Returns the grant (retry_after_ms 0: the wait is done), or the
        denial at the timeout (at once when the request can never succeed,
        n > capacity)."""
        call = _core.single("take", key, capacity, rate, n, policy)
        timeout_ms = _core.check_timeout_ms(timeout_ms)  # after the numbers, as the server checks them
        return self._run(call, _engine.wait_take, timeout_ms)

    # --- concurrency limits (docs/leases.md) --------------------------------

    def acquire(self, key: str, limit: int, lease_ms: int, *, policy: str = "default",
                fail_open: bool = False) -> Lease:
        """Take a lease on `key` if fewer than `limit` are live; it ends by
        itself after `lease_ms` unless released or renewed. `fail_open=True`:
        an unavailable limiter answers a Lease with acquired=True,
        lease=None, failed_open=True instead of raising LimiterUnavailable."""
        call = _core.acquire(key, limit, lease_ms, policy)
        return self._leased(call, fail_open)

    def release(self, key: str, lease) -> bool:
        """Release `lease` (a Lease or its id): True if it was live. None
        (no lease: denied or failed open) answers False without a call."""
        ident = _core.lease_id(lease)
        if ident is None:
            _core.check_key(key)
            return False
        return self._run(_core.release(key, ident))

    def renew(self, key: str, lease, lease_ms: int) -> bool:
        """Make a live lease end `lease_ms` from now: True, or False if it is
        not held any more (an expired lease cannot come back)."""
        ident = _core.lease_id(lease)
        call = _core.renew(key, ident or "-", lease_ms)
        if ident is None:
            return False
        return self._run(call)

    def wait_acquire(self, key: str, limit: int, lease_ms: int, *, timeout_ms: Number,
                     policy: str = "default", fail_open: bool = False,
                     poll_ms: Number = _engine.LEASE_POLL_S * 1000) -> Lease:
        """Acquire, waiting up to timeout_ms (0: no limit) for a slot.

        Module: TB.ACQUIRE with timeout_ms on a pooled connection of its own
        to the node that owns the key, first come first served by the
        server, woken by a release. Lua fallback: a client-side loop
        (acquire, sleep min(retry_after_ms, poll_ms), retry): NOT first come
        first served. Returns the grant, or the last denial at the timeout."""
        call = _core.acquire(key, limit, lease_ms, policy)
        timeout_ms = _core.check_timeout_ms(timeout_ms)  # after limit and lease_ms, as the server checks them
        poll_s = _core.check_timeout_ms(poll_ms) / 1000 or 0.001
        return self._leased(call, fail_open, _engine.wait_acquire, timeout_ms, poll_s)

    def lease(self, key: str, limit: int, lease_ms: int, *, timeout_ms: Optional[Number] = None,
              policy: str = "default", fail_open: bool = False,
              renew_every_ms: Optional[Number] = None) -> LeaseGuard:
        """A guard: ``with limiter.lease("jobs:{partner}", 4, 30_000) as guard:``
        acquires on entry (waits with timeout_ms; a denial raises
        LeaseDenied), renews every renew_every_ms (default lease_ms/3) while
        the block runs, releases on exit, also on an exception.
        `guard.lost` / `guard.check()`: a renewal found the lease gone."""
        return LeaseGuard(self, key, limit, lease_ms, timeout_ms=timeout_ms, policy=policy,
                          fail_open=fail_open, renew_every_ms=renew_every_ms)

    # --- the most-denied keys (docs/clients.md#the-most-denied-keys) --------

    def top(self, count: int = 10) -> List[TopKey]:
        """The `count` keys denied most over at least the last minute, the
        most denied first (ties by key bytes): TB.TOP COUNT count on the
        server, or on every primary of a cluster, merged. It needs the
        module: without it (or without the ACL's grant) the server's error
        is raised as LimiterReplyError; a primary that cannot be reached
        makes it LimiterUnavailable, never a partial answer."""
        return _engine.drive(_engine.top(count), self._execute)

    def close(self):
        """Close every connection the limiter opened: its own pool (a
        standalone `Redis`), and the connections it used for waits on a
        `RedisCluster`'s nodes. The client you passed stays open."""
        if self._own_client:
            self.client.connection_pool.disconnect()
            self.client.close()
        with self._blocking_lock:
            conns, self._blocking = list(self._blocking), weakref.WeakSet()
        for conn in conns:
            conn.disconnect()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["RateLimiter", "LimiterError", "LimiterUnavailable", "limiter_client"]

"""RateLimiter: the synchronous client on redis-py `Redis` / `RedisCluster`."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Optional, Sequence

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from . import _core
from ._core import (
    BACKENDS,
    BLOCKING_MARGIN_S,
    Decision,
    Limit,
    LimiterError,
    LimiterUnavailable,
    Number,
    translate,
)

log = logging.getLogger("redis_tb")

DEFAULT_TIMEOUT = 0.2


def _is_cluster(client) -> bool:
    return isinstance(client, RedisCluster)


def limiter_client(client, timeout: Optional[float]):
    """For a standalone `Redis`: a client of its own on the same server and
    settings (auth, db, TLS, ...) whose connect and command timeouts are
    `timeout` and which retries only a failed connection, once, at once
    (redis-py's default is 5 s and 10 retries with back-off: a hung server
    would hold each request for a minute). `timeout=None`: the client as is.
    A `RedisCluster` is used as it is (see README: give it short timeouts)."""
    if timeout is None or _is_cluster(client):
        return client
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1, supported_errors=(rex.ConnectionError,)),
        retry_on_error=[],
    )
    kwargs.pop("retry_on_timeout", None)
    own = redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    return redis.Redis(connection_pool=own)


class _Backend:
    """Backend selection shared by both limiters (no I/O of its own)."""

    def __init__(self, backend: str):
        if backend != "auto" and backend not in BACKENDS:
            raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, not {backend!r}")
        self.requested = backend
        self.chosen: Optional[str] = None
        self.script = _core.lua_script()
        self.library = _core.lua_library()
        self.sha = _core.sha1(self.script)

    def announce(self, backend: str, why: str) -> str:
        self.chosen = backend
        log.info("redis-tb backend: %s (%s)", backend, why)
        return backend


class RateLimiter:
    """Token buckets on a redis-py `Redis` or `RedisCluster`.

    backend: "auto" (default: the module if the server has TB.TAKE, else
    the Lua library via FUNCTION LOAD, else the Lua script via EVALSHA), or
    "module" / "function" / "script" to force one. Chosen at the first call
    or at `connect()`; `backend` tells which, and one INFO line on the
    "redis_tb" logger says why.

    timeout: seconds for connect and for each command (default 0.2); see
    `limiter_client`. Failures raise `LimiterUnavailable`, error replies
    `LimiterReplyError`.
    """

    def __init__(self, client, backend: str = "auto", timeout: Optional[float] = DEFAULT_TIMEOUT):
        self._state = _Backend(backend)
        self.timeout = timeout
        self.client = limiter_client(client, timeout)
        self._cluster = _is_cluster(self.client)
        self._lock = threading.Lock()
        if self._cluster and timeout is not None:
            own = self.client.nodes_manager.connection_kwargs.get("socket_timeout")
            if own is None or own > timeout:
                log.warning(
                    "redis-tb: this RedisCluster has socket_timeout=%r; the limiter uses it as "
                    "it is (create it with socket_timeout=socket_connect_timeout=%r to fail fast)",
                    own,
                    timeout,
                )

    # --- backend ---------------------------------------------------------

    @property
    def backend(self) -> Optional[str]:
        """"module", "function" or "script"; None until the first call."""
        return self._state.chosen

    def connect(self) -> str:
        """Choose the backend now (and load the Lua code if needed)."""
        if self._state.chosen is not None:
            return self._state.chosen
        with self._lock:
            if self._state.chosen is not None:
                return self._state.chosen
            try:
                return self._choose()
            except rex.RedisError as e:
                raise translate(e) from e

    def _on_all(self, *args):
        if self._cluster:
            return self.client.execute_command(*args, target_nodes=RedisCluster.PRIMARIES)
        return self.client.execute_command(*args)

    def _load_function(self):
        self._on_all("FUNCTION", "LOAD", "REPLACE", self._state.library)

    def _load_script(self):
        self._on_all("SCRIPT", "LOAD", self._state.script)

    @contextlib.contextmanager
    def _connection(self, key: Optional[str] = None):
        """A connection of the pool (a cluster: of the key's node, or any
        node), closed if the command on it did not end with a reply."""
        if self._cluster:
            node = self.client.get_node_from_key(key) if key else self.client.get_random_node()
            pool = node.redis_connection.connection_pool
        else:
            pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            yield conn
        except rex.ResponseError:
            raise
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def _raw(self, *args):
        """A command without redis-py's reply parsing (its COMMAND parser
        fails on the nil entry of an unknown command)."""
        with self._connection() as conn:
            conn.send_command(*args)
            return conn.read_response()

    def _choose(self) -> str:
        s = self._state
        if s.requested == "module":
            return s.announce("module", "forced")
        if s.requested == "function":
            self._load_function()
            return s.announce("function", "forced; FUNCTION LOAD tb done")
        if s.requested == "script":
            self._load_script()
            return s.announce("script", "forced; SCRIPT LOAD done")
        info = self._raw("COMMAND", "INFO", "tb.take")
        if _core.module_present(info):
            return s.announce("module", "the server has TB.TAKE")
        try:
            self._load_function()
        except rex.ResponseError as e:
            self._load_script()
            return s.announce(
                "script",
                f"no TB.TAKE; FUNCTION LOAD failed ({_core.reply_text(e)}); EVALSHA of lua/tb.lua",
            )
        return s.announce("function", "no TB.TAKE on the server; FUNCTION LOAD of lua/tb.lua")

    # --- calls -----------------------------------------------------------

    def _run(self, call: _core.Call) -> Decision:
        backend = self.connect()
        try:
            try:
                reply = self.client.execute_command(*_core.command(backend, call, self._state.sha))
            except rex.NoScriptError:
                # A restarted or flushed server: run the full text (which caches it there).
                reply = self.client.execute_command(*_core.eval_command(call, self._state.script))
            except rex.ResponseError as e:
                if backend != "function" or "Function not found" not in str(e):
                    raise
                self._load_function()
                reply = self.client.execute_command(*_core.command(backend, call, self._state.sha))
        except rex.RedisError as e:
            raise translate(e) from e
        return _core.decision(call, reply)

    def take(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, name: str = "default") -> Decision:
        """Take n tokens from the bucket `key` (burst `capacity`, `rate`/s)."""
        return self._run(_core.single("take", key, capacity, rate, n, name))

    def peek(self, key: str, capacity: Number, rate: Number, n: Number = 1, *, name: str = "default") -> Decision:
        """What `take` would answer now; writes nothing."""
        return self._run(_core.single("peek", key, capacity, rate, n, name))

    def refund(self, key: str, capacity: Number, rate: Number, n: Number, *, name: str = "default") -> Decision:
        """Give n tokens back (capped at capacity)."""
        return self._run(_core.single("refund", key, capacity, rate, n, name))

    def take_all(self, limits: Sequence[Limit]) -> Decision:
        """All limits or none; the Decision is the deciding limit's, `index` its position."""
        return self._run(_core.take_all(limits))

    def wait_take(
        self,
        key: str,
        capacity: Number,
        rate: Number,
        n: Number = 1,
        *,
        timeout_ms: Number,
        name: str = "default",
    ) -> Decision:
        """Take n tokens, waiting up to timeout_ms (0: no limit) for them.

        Module: TB.BTAKE, served first come first served by the server.
        Lua fallback: a client-side loop (take, sleep the announced wait,
        retry): NOT first come first served, waiters may overtake each other.
        Returns the grant, or the last denial at the timeout (at once when
        the request can never succeed, n > capacity)."""
        timeout_ms = _core.check_timeout_ms(timeout_ms)
        call = _core.single("take", key, capacity, rate, n, name)
        backend = self.connect()
        if backend == "module":
            try:
                reply = self._btake(key, _core.btake_command(key, call.numbers[0], timeout_ms), timeout_ms)
            except rex.RedisError as e:
                raise translate(e) from e
            return _core.decision(call, reply)
        deadline = None if timeout_ms == 0 else time.monotonic() + timeout_ms / 1000
        while True:
            d = self._run(call)
            if d.allowed or d.retry_after_ms < 0:
                return d
            pause = max(d.retry_after_ms, 1) / 1000
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return d
                pause = min(pause, left)
            time.sleep(pause)

    def _btake(self, key: str, cmd: list, timeout_ms: int):
        """TB.BTAKE on a connection of its own from the pool, read with a
        timeout of timeout_ms + BLOCKING_MARGIN_S (none for timeout_ms=0)."""
        wait = None if timeout_ms == 0 else timeout_ms / 1000 + BLOCKING_MARGIN_S
        with self._connection(key) as conn:
            conn.send_command(*cmd)
            if not conn.can_read(timeout=wait):
                raise rex.TimeoutError(f"no TB.BTAKE reply within {wait} s")
            return conn.read_response()

    def close(self):
        """Close the limiter's own connections (not the client you passed)."""
        if not self._cluster and self.timeout is not None:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["RateLimiter", "LimiterError", "LimiterUnavailable", "limiter_client"]

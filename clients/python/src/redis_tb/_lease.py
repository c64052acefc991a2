"""Lease guards: acquire on entry, renew in the background while the block
runs, release on exit (also when the block raises). `LeaseGuard` for
`RateLimiter` (``with``, a renewal thread), `AsyncLeaseGuard` for
`AsyncRateLimiter` (``async with``, a renewal task). See docs/leases.md and
README.md#concurrency-limits."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Optional

from . import _core, _engine, _metrics
from ._core import Lease, LeaseDenied, LeaseLost, LimiterError, LimiterUnavailable

log = logging.getLogger("redis_tb")


class _GuardBase:
    def __init__(self, limiter, key, limit, lease_ms, *, timeout_ms=None, policy="default",
                 fail_open=False, renew_every_ms=None):
        _core.acquire(key, limit, lease_ms, policy)  # checked now, before anything is sent
        if timeout_ms is not None:
            _core.check_timeout_ms(timeout_ms)
        if renew_every_ms is None:
            renew_every_ms = max(1, int(lease_ms) // 3)
        elif isinstance(renew_every_ms, bool) or not isinstance(renew_every_ms, (int, float)) or not renew_every_ms >= 0:
            raise _core.InvalidArgument(f"renew_every_ms must be a number >= 0 (0: no renewal), not {renew_every_ms!r}")
        self.limiter = limiter
        self.key = key
        self.limit = limit
        self.lease_ms = lease_ms
        self.timeout_ms = timeout_ms
        self.policy = policy
        self.fail_open = fail_open
        self.renew_every_s = renew_every_ms / 1000
        #: The Lease the guard entered with (None before entry).
        self.decision: Optional[Lease] = None
        #: The error that made the guard lost, if it was one (a bug such as
        #: WRONGTYPE); None when a renewal simply answered 0.
        self.error: Optional[BaseException] = None
        self.renewals = 0
        self._lost = False
        self._released = False
        self._warned = False
        self._held_until = 0.0  # monotonic: the lease's deadline as last known to be moved

    @property
    def lease(self) -> Optional[str]:
        """The lease id; None before entry and when failed open."""
        return self.decision.lease if self.decision else None

    @property
    def failed_open(self) -> bool:
        """Entered without a lease because the limiter was unavailable (fail_open=True)."""
        return bool(self.decision and self.decision.failed_open)

    @property
    def lost(self) -> bool:
        """A renewal found the lease no longer held (or failed with a bug):
        the work goes on without its slot, and another holder may have it."""
        return self._lost

    def check(self):
        """Raise LeaseLost if the lease was lost; call it between steps of
        long work that must stop when it no longer holds its slot."""
        if self._lost:
            raise LeaseLost(f"the lease {self.lease} on {self.key!r} is no longer held") from self.error

    def _entered(self, d: Lease):
        if not d.acquired:
            raise LeaseDenied(d)
        self.decision = d
        self._held_until = time.monotonic() + int(self.lease_ms) / 1000

    def _renewal(self):
        """One renewal, written once for both guards as an `_engine`
        operation: it is sent the renew call's reply or thrown its error,
        and returns whether renewing should go on. The thread runs it with
        `_engine.drive`, the task with `adrive`, both calling `_renew`."""
        try:
            ok = yield None
        except LimiterError as e:
            return self._renewed(error=e)
        return self._renewed(ok)

    def _renew(self, _step):
        return self.limiter.renew(self.key, self.lease, self.lease_ms)

    def _renewed(self, ok=None, error=None) -> bool:
        """Record one renewal; True while renewing should go on."""
        if error is None and ok:
            self.renewals += 1
            self._held_until = time.monotonic() + int(self.lease_ms) / 1000
            if self._warned:
                self._warned = False
                log.info("redis-tb: renewing lease %s on %r works again", self.lease, self.key)
            return True
        if isinstance(error, LimiterUnavailable) and time.monotonic() < self._held_until:
            # The lease may still be live: keep trying until its deadline;
            # past it, the lease has ended by itself (lost, below).
            if not self._warned:
                self._warned = True
                log.warning("redis-tb: cannot renew lease %s on %r (will retry): %s", self.lease, self.key, error)
            return True
        self.error = error
        self._lost = True
        metrics = _metrics.of(self.limiter)
        if metrics.enabled:
            # Lost because Redis could not be reached for lease_ms, or
            # because the server said the lease is gone (docs/clients.md#metrics).
            unreachable = isinstance(error, LimiterUnavailable)
            metrics.lease(self.policy, _metrics.LOST,
                          _metrics.UNAVAILABLE_DENIED if unreachable else _metrics.REDIS)
        if error is None:
            log.warning("redis-tb: lease %s on %r is no longer held (renewal answered 0)", self.lease, self.key)
        elif isinstance(error, LimiterUnavailable):
            log.warning("redis-tb: lease %s on %r could not be renewed for lease_ms; counting it lost: %s",
                        self.lease, self.key, error)
        else:
            log.error("redis-tb: renewing lease %s on %r failed; counting it lost: %s", self.lease, self.key, error)
        return False

    def _release_failed(self, error: LimiterError, raising: bool):
        if isinstance(error, LimiterUnavailable):
            log.warning("redis-tb: could not release lease %s on %r; it ends at its deadline: %s",
                        self.lease, self.key, error)
            return
        if raising:
            raise error
        log.error("redis-tb: releasing lease %s on %r failed: %s", self.lease, self.key, error)


class LeaseGuard(_GuardBase):
    """``with limiter.lease(key, limit, lease_ms) as guard:`` holds a lease
    for the block. Entry: acquire (wait_acquire with `timeout_ms`); a denial
    raises `LeaseDenied`. While the block runs, a daemon thread renews the
    lease every `renew_every_ms` (default lease_ms/3; 0: never). Exit: stop
    renewing, then release, also when the block raised. A release that
    meets an unavailable limiter is logged, not raised (the lease ends at
    its deadline by itself); a release that fails with a bug raises, unless
    the block is already raising. `lost` / `check()` tell the block when a
    renewal found the lease gone."""

    def __init__(self, limiter, *args, **kw):
        super().__init__(limiter, *args, **kw)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "LeaseGuard":
        lim = self.limiter
        if self.timeout_ms is None:
            d = lim.acquire(self.key, self.limit, self.lease_ms, policy=self.policy, fail_open=self.fail_open)
        else:
            d = lim.wait_acquire(self.key, self.limit, self.lease_ms, timeout_ms=self.timeout_ms,
                                 policy=self.policy, fail_open=self.fail_open)
        self._entered(d)
        if d.lease is not None and self.renew_every_s > 0:
            self._thread = threading.Thread(target=self._renew_loop, name=f"redis-tb lease {d.lease}", daemon=True)
            self._thread.start()
        return self

    def _renew_loop(self):
        while not self._stop.wait(self.renew_every_s):
            if not _engine.drive(self._renewal(), self._renew):
                return

    def release(self) -> bool:
        """Stop renewing and release now (exit does it too; once only).
        True if the lease was held until now."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._released or self.lease is None:
            return False
        self._released = True
        return self.limiter.release(self.key, self.lease)

    def __exit__(self, exc_type, exc, tb):
        try:
            self.release()
        except LimiterError as e:
            self._release_failed(e, raising=exc_type is None)
        return False


class AsyncLeaseGuard(_GuardBase):
    """``async with limiter.lease(key, limit, lease_ms) as guard:``: the
    `LeaseGuard` of `AsyncRateLimiter`; renewals run in an asyncio task."""

    def __init__(self, limiter, *args, **kw):
        super().__init__(limiter, *args, **kw)
        self._stop: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None

    async def __aenter__(self) -> "AsyncLeaseGuard":
        lim = self.limiter
        if self.timeout_ms is None:
            d = await lim.acquire(self.key, self.limit, self.lease_ms, policy=self.policy, fail_open=self.fail_open)
        else:
            d = await lim.wait_acquire(self.key, self.limit, self.lease_ms, timeout_ms=self.timeout_ms,
                                       policy=self.policy, fail_open=self.fail_open)
        self._entered(d)
        if d.lease is not None and self.renew_every_s > 0:
            self._stop = asyncio.Event()
            self._task = asyncio.ensure_future(self._renew_loop())
        return self

    async def _renew_loop(self):
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self.renew_every_s)
                return
            except asyncio.TimeoutError:
                pass
            if not await _engine.adrive(self._renewal(), self._renew):
                return

    async def release(self) -> bool:
        """Stop renewing and release now (exit does it too; once only)."""
        if self._stop is not None:
            self._stop.set()
        if self._task is not None and self._task is not asyncio.current_task():
            await asyncio.gather(self._task, return_exceptions=True)
        if self._released or self.lease is None:
            return False
        self._released = True
        return await self.limiter.release(self.key, self.lease)

    async def __aexit__(self, exc_type, exc, tb):
        try:
            await self.release()
        except LimiterError as e:
            self._release_failed(e, raising=exc_type is None)
        return False


__all__ = ["AsyncLeaseGuard", "LeaseGuard"]

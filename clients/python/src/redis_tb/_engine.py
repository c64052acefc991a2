"""The limiter's logic, written once for the sync and the async driver.

Each operation is a generator that yields the I/O it needs (`Send`,
`Block`, `Sleep`) and gets back the reply, or has the exception thrown in.
`RateLimiter` runs these with blocking calls, `AsyncRateLimiter` with
awaits; neither holds any logic of its own. Backend choice, the failure
rule (docs/clients.md#the-failure-rule), the retry after a server change,
redirections of a blocking wait and the polling fallback all live here, and
the `Shield`: what is answered without Redis (the denial cache, the local
limiter during an outage; their rules are in `_local`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional, Tuple

import redis.exceptions as rex

from . import _core, _local
from ._core import BACKENDS, BLOCKING_MARGIN_S, MAX_BLOCKING_READ_S, SERVER_CHANGED, UNAVAILABLE, Call, Decision, classify

log = logging.getLogger("redis_tb")

#: While on Lua after having seen the module, look for it at most this
#: often (the limiter's `module_recheck_ms`).
MODULE_RECHECK_MS = 30_000

#: MOVED/ASK replies a blocking wait follows before it gives up (a slot
#: moves once; several in a row mean the cluster is being resharded).
MAX_REDIRECTIONS = 5

# Where a `Send` goes.
BY_KEY = "key"  # the client routes it (in a cluster: by its keys)
PRIMARIES = "primaries"  # every primary (loading Lua code)
RAW = "raw"  # any one node, reply unparsed (redis-py fails on COMMAND INFO's nil)
EVERY_PRIMARY = "every_primary"  # the server, or each primary once: the list of replies, unparsed


#: How many times the limiter's timeout a step that loads Lua code or looks
#: for the module may take (it happens once, and FUNCTION LOAD compiles).
DETECTION_TIMEOUT_FACTOR = 5


@dataclass(frozen=True)
class Send:
    """A command; `retry`: sent again once on a new connection if the
    connection dropped under it (`_core.is_dropped`)."""

    args: tuple
    route: str = BY_KEY
    retry: bool = True

    @property
    def detecting(self) -> bool:
        return self.route in (PRIMARIES, RAW)


@dataclass(frozen=True)
class Block:
    """A blocking command on a connection of its own from the pool of the
    node that owns `key` (or of `node`, after a redirection), preceded by
    ASKING after an ASK; its reply is read for up to `wait_s` (None: for
    ever)."""

    key: str
    args: tuple
    wait_s: Optional[float]
    node: Optional[Tuple[str, int]] = None
    asking: bool = False
    retry: bool = True


@dataclass(frozen=True)
class Sleep:
    seconds: float


class BackendState:
    """Which backend a limiter uses, and why; changed only by `detect` and
    `ensure`."""

    def __init__(self, requested: str, module_recheck_ms=MODULE_RECHECK_MS):
        if requested != "auto" and requested not in BACKENDS:
            raise _core.InvalidArgument(f"backend must be 'auto' or one of {BACKENDS}, not {requested!r}")
        self.requested = requested
        self.chosen: Optional[str] = None
        self.seen_module = False
        self.next_module_check = 0.0
        self.recheck_s = int(_core.whole_text(module_recheck_ms, "module_recheck_ms")) / 1000
        self.library = _core.lua_library()
        self.script = _core.lua_script()
        self.sha = _core.sha1(self.script)

    def use(self, backend: str, why: str) -> str:
        before, self.chosen = self.chosen, backend
        if backend == "module":
            self.seen_module = True
        else:
            self.next_module_check = time.monotonic() + self.recheck_s
        if before == backend:
            pass
        elif before == "module":
            log.warning("redis-tb: the module went away; going on with the Lua backend %s (%s)", backend, why)
        elif before is not None and backend == "module":
            log.info("redis-tb: the module is back; moving to it from %s (%s)", before, why)
        elif backend != "module" and self.requested == "auto":
            # Not what "auto" hoped for: slower, and wait_acquire polls (not FIFO). A
            # WARNING reaches stderr even where the app configured no logging
            # (logging.lastResort); forcing the Lua backend makes it an INFO line.
            log.warning(
                "redis-tb backend: %s, the Lua fallback (%s); wait_acquire polls, not first come first "
                "served (load the module, or pass backend=%r to choose Lua and log this at INFO)",
                backend,
                why,
                backend,
            )
        else:
            log.info("redis-tb backend: %s (%s)", backend, why)
        return backend


def _module_present():
    """Is TB.TAKE there? An error reply to COMMAND INFO (an ACL that forbids
    it, a proxy without it) means no; an unavailable server raises."""
    try:
        info = yield Send(("COMMAND", "INFO", "tb.take"), RAW)
    except Exception as e:
        if classify(e) == UNAVAILABLE:
            raise
        return False
    return _core.module_present(info)


def detect(state: BackendState):
    """Choose the backend (forced, or: module, else FUNCTION LOAD, else the
    script) and load the Lua code it needs on every primary."""
    if state.requested == "module":
        return state.use("module", "forced")
    if state.requested == "function":
        yield Send(("FUNCTION", "LOAD", "REPLACE", state.library), PRIMARIES)
        return state.use("function", "forced; FUNCTION LOAD of lua/tb.lua")
    if state.requested == "script":
        yield Send(("SCRIPT", "LOAD", state.script), PRIMARIES)
        return state.use("script", "forced; SCRIPT LOAD of lua/tb.lua")
    if (yield from _module_present()):
        return state.use("module", "the server has TB.TAKE")
    try:
        yield Send(("FUNCTION", "LOAD", "REPLACE", state.library), PRIMARIES)
    except Exception as e:
        if classify(e) == UNAVAILABLE:
            raise
        yield Send(("SCRIPT", "LOAD", state.script), PRIMARIES)
        why = f"no TB.TAKE; FUNCTION LOAD failed ({_core.reply_text(e)}); EVALSHA of lua/tb.lua"
        return state.use("script", why)
    return state.use("function", "no TB.TAKE on the server; FUNCTION LOAD of lua/tb.lua")


def ensure(state: BackendState):
    """The backend for the next call: detected on the first call that
    reaches the server; on Lua after the module went away, the module is
    looked for again at most every `recheck_s`."""
    if state.chosen is None:
        return (yield from detect(state))
    if (
        state.chosen != "module"
        and state.seen_module
        and state.requested == "auto"
        and time.monotonic() >= state.next_module_check
    ):
        state.next_module_check = time.monotonic() + state.recheck_s
        if (yield from _module_present()):
            return state.use("module", "the server has TB.TAKE again")
    return state.chosen


def _translated(gen):
    """Run `gen`, raising every error as this library's class of it."""
    try:
        return (yield from gen)
    except _core.LimiterError:
        raise
    except Exception as e:
        raise _core.limiter_error(e) from e


def run(state: BackendState, call: Call):
    """One call under the failure rule: a server change (module gone,
    script or function flushed) detects the backend again and retries once;
    any other error, or the retry's, is raised as its class."""
    return (yield from _translated(_run(state, call)))


def _run(state: BackendState, call: Call):
    backend = yield from ensure(state)
    try:
        reply = yield Send(tuple(_core.command(backend, call, state.sha)), retry=call.retry)
    except Exception as e:
        if classify(e) != SERVER_CHANGED:
            raise
        log.info("redis-tb: %s; detecting the backend again", _core.reply_text(e))
        backend = yield from detect(state)
        reply = yield Send(tuple(_core.command(backend, call, state.sha)), retry=call.retry)
    return _core.result(call, reply)


def top(count):
    """TB.TOP COUNT count made once for the whole deployment: the server,
    or every primary of a cluster (each counts the keys it owns), merged.
    The module's alone, so no backend is detected and no Lua runs; its
    errors are raised as their class (no module: a reply error)."""
    args = _core.top_command(count)
    return (yield from _translated(_top(args, int(args[2]))))


def _top(args, count: int):
    replies = yield Send(args, EVERY_PRIMARY)
    return _core.top_rows(replies, count)


#: wait_acquire without the module polls at least this often: a release
#: frees a slot long before the earliest lease ends by itself.
LEASE_POLL_S = 0.1


def wait_acquire(state: BackendState, call: Call, timeout_ms: int, poll_s: float = LEASE_POLL_S):
    """Acquire, waiting up to timeout_ms (0: no limit). Module: TB.ACQUIRE
    with timeout_ms on the slot owner, first come first served by the
    server. Lua: acquire, sleep min(retry_after_ms, poll_s), retry (not
    first come first served). (Failing open is the driver's `_leased`.)"""
    return (yield from _translated(_wait(state, call, timeout_ms, poll_s)))


def wait_take(state: BackendState, call: Call, timeout_ms: int):
    """Take, waiting up to timeout_ms (0: no limit). Module: TB.BTAKE on the
    slot owner, served first come first served by the server. Lua: take,
    sleep the announced wait, retry (not first come first served)."""
    return (yield from _translated(_wait(state, call, timeout_ms, None)))


def _done(d) -> bool:
    """Is a polling wait over: granted, or never possible?"""
    if isinstance(d, _core.Lease):
        return d.acquired
    return d.allowed or d.retry_after_ms < 0


def _wait(state: BackendState, call: Call, timeout_ms: int, poll_s: Optional[float]):
    deadline = None if timeout_ms == 0 else time.monotonic() + timeout_ms / 1000
    backend = yield from ensure(state)
    if backend == "module":
        try:
            return (yield from _btake(call, deadline))
        except Exception as e:
            if classify(e) != SERVER_CHANGED:
                raise
            log.info("redis-tb: %s; detecting the backend again", _core.reply_text(e))
            if (yield from detect(state)) == "module":
                return (yield from _btake(call, deadline))
    if call.op == "take":
        return (yield from _reserve(state, call, deadline, timeout_ms))
    while True:
        d = yield from _run(state, call)
        if _done(d):
            return d
        pause = max(d.retry_after_ms, 1) / 1000
        if poll_s is not None:
            pause = min(pause, poll_s)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return d
            pause = min(pause, left)
        yield Sleep(pause)


def _reserve(state: BackendState, call: Call, deadline: Optional[float], timeout_ms: int):
    """wait_take without the module: ONE reservation (TB.TAKE's MAXWAIT,
    the timeout; no limit is MAXWAIT 2^53) and one sleep for the delay it
    returns. Reservations queue in the bucket's debt, so this is first come
    first served like TB.BTAKE. The grant comes back after the sleep with
    retry_after_ms 0 (the wait is done) and reset_after_ms counted from the
    sleep's end, as TB.BTAKE counts it from its grant (the reservation's
    reply counts from the reservation, a sleep earlier). A denial (the
    tokens do not come within the timeout) sleeps out the timeout like
    TB.BTAKE, then takes once more, plainly, and answers that: only a
    refund can have helped."""
    reserve = call.with_options(("MAXWAIT", str(timeout_ms or _core.MAX_AMOUNT)))
    d = yield from _run(state, reserve)
    if d.allowed:
        if d.retry_after_ms > 0:
            yield Sleep(d.retry_after_ms / 1000)
        return dataclasses.replace(d, retry_after_ms=0,
                                   reset_after_ms=max(d.reset_after_ms - d.retry_after_ms, 0))
    if d.retry_after_ms < 0 or deadline is None:
        return d
    left = deadline - time.monotonic()
    if left > 0:
        yield Sleep(left)
    return (yield from _run(state, call))


def redirection(error: BaseException) -> Optional[Tuple[str, str, int]]:
    """("MOVED" | "ASK", host, port) of a redirection reply, else None."""
    if not isinstance(error, rex.ResponseError):
        return None
    parts = _core.reply_text(error).split(" ")
    if len(parts) != 3 or parts[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = parts[2].rpartition(":")
    return parts[0], host, int(port)


def _btake(call: Call, deadline: Optional[float]):
    key = call.keys[0]
    node, asking = None, False
    for _ in range(MAX_REDIRECTIONS + 1):
        if deadline is None:
            timeout_ms, wait_s = 0, None
        else:
            timeout_ms = max(1, int((deadline - time.monotonic()) * 1000))
            wait_s = timeout_ms / 1000 + BLOCKING_MARGIN_S
            if wait_s > MAX_BLOCKING_READ_S:
                wait_s = None
        try:
            reply = yield Block(key, tuple(_core.blocking_command(call, timeout_ms)), wait_s, node, asking)
        except Exception as e:
            moved = redirection(e)
            if moved is None:
                raise
            kind, host, port = moved
            node, asking = (host, port), kind == "ASK"
            continue
        return _core.result(call, reply)
    raise _core.LimiterUnavailable(f"{_core.blocking_command(call, 0)[0]}: more than {MAX_REDIRECTIONS} redirections (the cluster is resharding)")


#: The calls the local limiter answers during an outage; every other call
#: (refund, charge, unblock, waits, leases) raises LimiterUnavailable.
LOCAL_OPS = frozenset({"take", "peek", "takeall"})
#: The calls the denial cache answers (a peek takes nothing: it goes to Redis).
CACHED_OPS = frozenset({"take", "takeall"})
#: The calls that drop the key's cached denial (when sent): they may give
#: tokens back or lift a lock.
FORGETTING_OPS = frozenset({"refund", "charge", "unblock"})


def _choice(value, what: str, allowed) -> str:
    if value not in allowed:
        raise _core.InvalidArgument(f"{what} must be one of {allowed}, not {value!r}")
    return value


def _positive_int(value, what: str) -> int:
    _core.whole_text(value, what)
    if value < 1:
        raise _core.InvalidArgument(f"{what} must be at least 1, not {value!r}")
    return int(value)


class Shield:
    """A limiter's answers without a round trip: the denial cache
    (`cache_denials`), and with on_unavailable="local" the local limiter,
    which answers during an `Outage` (while Redis is unreachable, probing
    it again every `local_probe_ms`). Both drivers ask it before a call
    (`before`), and tell it how the call went (`after`, `failed`)."""

    def __init__(self, on_unavailable="raise", instances=1, local_max_keys=10_000, local_probe_ms=1_000,
                 cache_denials=False, clock=_local.wall_ms):
        self.on_unavailable = _choice(on_unavailable, "on_unavailable", ("raise", "local"))
        self.instances = _positive_int(instances, "instances")
        self.local_max_keys = _positive_int(local_max_keys, "local_max_keys")
        _core.whole_text(local_probe_ms, "local_probe_ms")
        self.local_probe_ms = int(local_probe_ms)
        if not isinstance(cache_denials, bool):
            raise _core.InvalidArgument(f"cache_denials must be a bool, not {cache_denials!r}")
        self.local = _local.LocalLimiter(self.instances, self.local_max_keys) if on_unavailable == "local" else None
        self.outage = _local.Outage(self.local_probe_ms, self.instances)  # only the local limiter starts one
        self.denials = _local.DenialCache(self.local_max_keys) if cache_denials else None
        self.clock = clock
        self._lock = threading.Lock()

    # `plain`: the call is one command (not a wait), so the cache and the
    # local limiter may answer it.

    def before(self, call: Call, plain: bool = True) -> Optional[Decision]:
        """An answer without Redis, or None: send the call. During an
        outage, between probes, a call the local limiter cannot answer
        raises LimiterUnavailable without a round trip."""
        denials = self.denials
        if denials is not None:
            if call.op in FORGETTING_OPS:
                denials.forget(call.keys[0])
            elif plain and denials.entries and call.op in CACHED_OPS:
                with self._lock:
                    d = denials.answer(call, self.clock())
                if d is not None:
                    return d
        outage = self.outage
        if not outage.active:
            return None
        with self._lock:
            now = self.clock()
            if outage.should_send(now):  # this call probes Redis; the others wait for it
                return None
            if plain and call.op in LOCAL_OPS:
                return self.local.decide(call, now)
        raise _core.LimiterUnavailable(f"Redis unreachable ({outage.reason}); next try within {self.local_probe_ms} ms")

    def after(self, call: Call, result, plain: bool = True):
        """The call reached Redis: an outage is over; a denial is remembered."""
        if self.outage.active:
            with self._lock:
                ended = self.outage.succeeded()
                if ended:
                    self.local.clear()
            if ended:
                log.warning("redis-tb: Redis reachable again; limits come from Redis")
        if self.denials is not None and plain and call.op in CACHED_OPS:
            with self._lock:
                self.denials.remember(call, result, self.clock())

    def failed(self, call: Call, error: _core.LimiterUnavailable, plain: bool = True) -> Decision:
        """The call found Redis unreachable: raise `error`, or (the local
        limiter) start the outage and answer locally what it can."""
        if self.local is None:
            raise error
        with self._lock:
            now = self.clock()
            if self.outage.failed(str(error), now):
                log.warning("redis-tb: Redis unreachable (%s); limiting in process at 1/%d of each limit",
                            error, self.instances)
            if plain and call.op in LOCAL_OPS:
                return self.local.decide(call, now)
        raise error


def drive(gen, execute):
    """Run an operation with a blocking `execute(step) -> reply`.

    It is `adrive`'s loop, so that both drivers feed replies and errors to
    the operation in one way: `execute` wrapped in a coroutine that never
    suspends, which therefore finishes on its first send, without an event
    loop (about half a microsecond more than a loop of its own)."""

    async def execute_now(step):
        return execute(step)

    coro = adrive(gen, execute_now)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("drive: an operation awaited something; only adrive can run it")


async def adrive(gen, execute):
    """Run an operation with an async `execute(step) -> reply`. A step whose
    connection dropped under it is executed once more, on a new connection
    (docs/clients.md#a-dropped-connection-is-not-an-outage): a restart or an
    idle timeout is not an outage; the retry's error is the step's."""
    try:
        step = next(gen)
        while True:
            try:
                try:
                    result = await execute(step)
                except Exception as e:
                    if not (getattr(step, "retry", False) and _core.is_dropped(e)):
                        raise
                    result = await execute(step)
            except Exception as e:
                step = gen.throw(e)
            else:
                step = gen.send(result)
    except StopIteration as done:
        return done.value

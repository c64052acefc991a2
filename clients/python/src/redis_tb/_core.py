"""The plain parts both limiters share: errors and the failure rule,
arguments, keys, commands, replies, decisions and headers.

Nothing here does I/O; `_engine` strings these together into calls, and
`RateLimiter` / `AsyncRateLimiter` only send what it asks for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import math
import numbers
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import List, Optional, Sequence, Tuple, Union

import redis.exceptions as rex

Number = Union[int, float]

BACKENDS = ("module", "function", "script")

#: Added to timeout_ms for the socket read timeout of TB.BTAKE, so the server
#: answers (a denial on its own timeout) before the client gives up.
BLOCKING_MARGIN_S = 1.0

#: The longest socket read timeout of a blocking call (poll() takes a C int
#: of ms, 24.8 days). A longer wait (timeout_ms may be 2^53, 285,000 years)
#: reads without one, as a wait with no limit does.
MAX_BLOCKING_READ_S = 2_000_000.0

#: The largest capacity, and cost, the server accepts (docs/commands.md).
MAX_AMOUNT = 2**53

# Structured Fields integers have at most 15 digits (RFC 8941 3.3.1).
_SF_INT_MAX = 999_999_999_999_999


# --- errors ------------------------------------------------------------------


class LimiterError(Exception):
    """Base class of every error this library raises. Raised as itself for
    a bug that is not an error reply (a reply of the wrong shape, a client
    error that says nothing about the server's health)."""


class InvalidArgument(LimiterError, ValueError):
    """A policy, number, key or name that the server would refuse: raised
    when the limiter, the policy or the middleware is created, or before a
    call sends anything."""


#: Another name for InvalidArgument, kept from before the first release
#: (when it was raised for numbers only).
InvalidNumber = InvalidArgument


class LimiterUnavailable(LimiterError):
    """The server could not answer: connection refused, reset or closed, a
    timeout, or an error reply about the server's state (LOADING, BUSY,
    CLUSTERDOWN, READONLY, ...). The middleware fails open (or closed) on
    these and only these; `__cause__` is redis-py's exception."""


class LimiterReplyError(LimiterError):
    """The server refused the call with an error reply that is a bug of the
    configuration or the data (WRONGTYPE, CROSSSLOT, a corrupt bucket,
    NOPERM, ...). `message` is the server's full text, identical for the
    module and the Lua fallback."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class LeaseDenied(Exception):
    """A lease guard could not get a lease (the limit is reached, or the
    wait timed out). Not a LimiterError: the limiter worked, the answer is
    no. `decision` is the `Lease` denial (`retry_after_ms`, `available`)."""

    def __init__(self, decision: "Lease"):
        super().__init__(
            f"no lease on {decision.key!r}: {decision.limit} in use; retry in {decision.retry_after_ms} ms"
        )
        self.decision = decision

    @property
    def retry_after_ms(self) -> int:
        return self.decision.retry_after_ms


class LeaseLost(LimiterError):
    """Raised by a lease guard's `check()` once a renewal found the lease
    no longer held (it expired, or someone deleted the key): another holder
    may now have the slot."""


# The three classes of docs/clients.md#the-failure-rule.
UNAVAILABLE = "unavailable"
SERVER_CHANGED = "server_changed"
BUG = "bug"

_UNAVAILABLE_CODES = frozenset(
    {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "UNBLOCKED", "NOREPLICAS", "OOM"}
)
_SERVER_CHANGED_STARTS = ("ERR unknown command", "NOSCRIPT", "ERR Function not found", "ERR No matching library")

# The error code of redis-py exceptions whose text lost it: redis-py < 5.1
# strips a known code and has no `status_code` (exact types: MovedError is
# an AskError).
_CODE_OF_CLASS = {
    rex.NoScriptError: "NOSCRIPT",
    rex.OutOfMemoryError: "OOM",
    rex.ExecAbortError: "EXECABORT",
    rex.ReadOnlyError: "READONLY",
    rex.NoPermissionError: "NOPERM",
    rex.BusyLoadingError: "LOADING",
    rex.AskError: "ASK",
    rex.MovedError: "MOVED",
    rex.TryAgainError: "TRYAGAIN",
    rex.ClusterDownError: "CLUSTERDOWN",
    rex.MasterDownError: "MASTERDOWN",
    rex.ClusterCrossSlotError: "CROSSSLOT",
    rex.ModuleError: "ERR",
}


def reply_text(error: BaseException) -> str:
    """The server's error text as it was sent. redis-py strips a code it
    knows (``ERR``, ``NOSCRIPT``...) and keeps it in `status_code` (5.1+), or
    only in the exception's class (5.0)."""
    text = str(error)
    code = getattr(error, "status_code", None) or _CODE_OF_CLASS.get(type(error))
    if code is None and type(error) is rex.ResponseError:
        first = text.split(" ", 1)[0]
        # An unknown code (WRONGTYPE, BUSY, ...) is left in the text; what
        # is left of an ``ERR`` reply starts with a word that is not a code.
        if not (first.isupper() and first.isalpha()):
            code = "ERR"
    if code and text != code and not text.startswith(code + " "):
        text = f"{code} {text}" if text else code
    return text


def classify_reply(text: str) -> str:
    """The class of a server's error reply (its text as sent), by its first
    word: UNAVAILABLE, SERVER_CHANGED or BUG."""
    if text.startswith(_SERVER_CHANGED_STARTS):
        return SERVER_CHANGED
    if text.split(" ", 1)[0] in _UNAVAILABLE_CODES:
        return UNAVAILABLE
    return BUG


def classify(error: BaseException) -> str:
    """The one failure rule (docs/clients.md#the-failure-rule) over any
    error a call can meet: UNAVAILABLE, SERVER_CHANGED or BUG."""
    if isinstance(error, LimiterUnavailable):
        return UNAVAILABLE
    if isinstance(error, LimiterError):
        return BUG
    # redis-py's own classes for the server's state (LOADING is a
    # BusyLoadingError, a ConnectionError) and for the socket's.
    if isinstance(error, (rex.ConnectionError, rex.TimeoutError, rex.ClusterDownError, rex.TryAgainError)):
        return UNAVAILABLE
    if isinstance(error, rex.ResponseError):
        return classify_reply(reply_text(error))
    if isinstance(error, (rex.ClusterError, rex.SlotNotCoveredError, OSError, asyncio.TimeoutError)):
        # ClusterError: redirections or connection errors used up the
        # cluster client's attempts; SlotNotCovered: no node owns the slot.
        return UNAVAILABLE
    if isinstance(error, rex.RedisClusterException) and "cannot be connected" in str(error):
        return UNAVAILABLE  # the cluster client could reach no startup node
    return BUG


def is_dropped(error: BaseException) -> bool:
    """Did the connection drop under the call (reset, broken pipe, end of
    file, closed), so that sending it again on a new one may succeed? Not a
    timeout (the server may be slow and still run the first copy), nor
    LOADING (redis-py makes it a ConnectionError; it is the server's state)."""
    if isinstance(error, (rex.TimeoutError, rex.BusyLoadingError, asyncio.TimeoutError)):
        return False
    return isinstance(error, (rex.ConnectionError, ConnectionError, EOFError, asyncio.IncompleteReadError))


def limiter_error(error: BaseException) -> LimiterError:
    """`error` as this library's exception, by its class. A server change
    that is left after the one retry is a bug: the server keeps changing
    under the limiter."""
    if isinstance(error, LimiterError):
        return error
    kind = classify(error)
    if kind == UNAVAILABLE:
        return LimiterUnavailable(f"{type(error).__name__}: {error}")
    if isinstance(error, rex.ResponseError):
        return LimiterReplyError(reply_text(error))
    return LimiterError(f"{type(error).__name__}: {error}")


# --- arguments ---------------------------------------------------------------


def number_text(value: Number, what: str, *, positive: bool) -> str:
    """The shortest exact decimal text of `value` (str() of an int, repr()
    of a float, the shortest round-tripping text), after checking it as the
    server would: finite, at most 2^53, and positive (capacity, rate) or
    non-negative (n). A bad value is refused here, before anything is sent.
    The bound is judged on the exact value, as the server judges it on the
    exact text: Fraction(2**54 + 1, 2), 2^53 + 1/2, becomes the float 2^53
    but is refused; an int or a Fraction beyond every float is a finite
    number above 2^53 (and a rate no double holds)."""
    kind = type(value)
    if kind is int or kind is float:  # the usual case, without the (slow) ABC checks below
        x = value
        finite = kind is int or math.isfinite(x)
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{what} must be an int or a float, not {type(value).__name__}")
    else:
        x = value if isinstance(value, numbers.Integral) else _double(value)
        finite = _finite(x)
    if not finite:
        raise InvalidArgument(f"{what} must be a finite number, not {x!r}")
    if positive and x <= 0:
        raise InvalidArgument(f"{what} must be a positive finite number, not {x!r}")
    if x < 0:
        raise InvalidArgument(f"{what} must be a non-negative finite number, not {x!r}")
    if what != "rate" and (x > MAX_AMOUNT or (x == MAX_AMOUNT and value > MAX_AMOUNT)):
        raise InvalidArgument(f"{what} must be at most {MAX_AMOUNT} (2^53), not {value!r}")
    if isinstance(x, int) and x <= MAX_AMOUNT:
        return str(int(x))
    x = _double(x)
    if not isinstance(x, float):  # only a rate gets here
        raise InvalidArgument(f"{what} must be at most {sys.float_info.max!r}, not {value!r}")
    if x == int(x) and x < 1e16:
        return str(int(x))  # 20.0 -> "20": same value, shorter text
    return repr(x)


def _double(value):
    """float(value), or `value` itself when no float holds it (an int or a
    Fraction beyond 1.8e308, which float() refuses with OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return value


def _finite(x) -> bool:
    """math.isfinite(x), for exact numbers too large for a float as well
    (an int or a Fraction is always finite)."""
    return isinstance(x, numbers.Rational) or math.isfinite(x)


def check_key(key) -> str:
    if not isinstance(key, (str, bytes)) or not key:
        raise InvalidArgument(f"a key must be a non-empty str, not {key!r}")
    return key


def check_name(name) -> str:
    # For ASCII text, isprintable() is exactly 0x20..0x7E.
    if not isinstance(name, str) or not name or not (name.isascii() and name.isprintable()):
        raise InvalidArgument(f"a policy name must be non-empty printable ASCII, not {name!r}")
    return name


def check_timeout_ms(timeout_ms) -> int:
    """A wait in ms, >= 0 (0: no limit) and at most 2^53 by its exact value,
    as the server's timeout_ms: the whole ms it is sent as (rounded up)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, numbers.Real):
        raise InvalidArgument("timeout_ms must be a number of milliseconds")
    if not _finite(timeout_ms) or timeout_ms < 0:
        raise InvalidArgument("timeout_ms must be a finite number >= 0 (0: no limit)")
    if timeout_ms > MAX_AMOUNT:
        raise InvalidArgument(f"timeout_ms must be at most {MAX_AMOUNT} (2^53), not {timeout_ms!r}")
    return int(math.ceil(timeout_ms))


def whole_text(value, what: str) -> str:
    """A lease argument (limit, lease_ms): a positive whole number at most
    2^53, sent as plain digits (the module accepts nothing else)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{what} must be a positive integer, not {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        x = int(value)
    elif _finite(value) and value == int(value):
        x = int(value)
    else:
        raise InvalidArgument(f"{what} must be a positive integer, at most 2^53, not {value!r}")
    if not 0 < x <= MAX_AMOUNT:
        raise InvalidArgument(f"{what} must be a positive integer, at most 2^53, not {value!r}")
    return str(x)


def ms_text(value, what: str, least: int) -> str:
    """A whole number of ms in [least, 2^53] (MAXWAIT: least 0; BLOCK,
    MAXBLOCK: least 1), sent as plain digits (the server takes no other)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{what} must be a whole number of ms, not {type(value).__name__}")
    if not isinstance(value, numbers.Integral) and not (_finite(value) and value == int(value)):
        raise InvalidArgument(f"{what} must be a whole number of ms, not {value!r}")
    x = int(value)
    if not least <= x <= MAX_AMOUNT:
        raise InvalidArgument(f"{what} must be a whole number of ms from {least} to 2^53, not {value!r}")
    return str(x)


def lockout_options(block_ms, max_block_ms) -> Tuple[str, ...]:
    """``BLOCK ms [MAXBLOCK ms]`` of a take (docs/clients.md#lockout): none
    without block_ms; max_block_ms needs block_ms and is at least it."""
    if block_ms is None:
        if max_block_ms is not None:
            raise InvalidArgument("max_block_ms needs block_ms")
        return ()
    block = ms_text(block_ms, "block_ms", 1)
    if max_block_ms is None:
        return ("BLOCK", block)
    most = ms_text(max_block_ms, "max_block_ms", 1)
    if int(most) < int(block):
        raise InvalidArgument(f"max_block_ms must be at least block_ms ({block}), not {max_block_ms!r}")
    return ("BLOCK", block, "MAXBLOCK", most)


def take_options(max_wait_ms, block_ms=None, max_block_ms=None) -> Tuple[str, ...]:
    """The options of TB.TAKE / TB.TAKEALL: ``MAXWAIT ms`` (a reservation;
    0 or None: none) and the lockout's ``BLOCK``/``MAXBLOCK``."""
    options: Tuple[str, ...] = ()
    if max_wait_ms is not None:
        wait = ms_text(max_wait_ms, "max_wait_ms", 0)
        if wait != "0":
            options = ("MAXWAIT", wait)
    return options + lockout_options(block_ms, max_block_ms)


def lease_id(lease) -> Optional[str]:
    """The id of `lease` (a `Lease`, an id, or None: no lease)."""
    if isinstance(lease, Lease):
        return lease.lease
    if lease is None:
        return None
    if isinstance(lease, bytes):
        lease = lease.decode("utf-8", "surrogateescape")
    if not isinstance(lease, str) or not lease:
        raise InvalidArgument(f"a lease must be a Lease, a non-empty id str or None, not {lease!r}")
    return lease


# --- keys --------------------------------------------------------------------


def escape_id(identity: str) -> str:
    """An id as it goes between the braces of a bucket key: ``%`` -> ``%25``,
    ``{`` -> ``%7B``, ``}`` -> ``%7D``, empty -> ``%`` (which escaping never
    produces). The result has no brace and is never empty, so the hash tag
    is always exactly it (docs/clients.md#keys-no-id-can-break)."""
    if identity == "":
        return "%"
    return identity.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def bucket_key(prefix: str, identity: str, policy: str) -> str:
    """``<prefix>{<escaped id>}:<policy>``: one hash tag per caller, so all
    of a caller's buckets share a cluster slot, whatever the id holds."""
    return f"{prefix}{{{escape_id(identity)}}}:{policy}"


# --- the Lua fallback --------------------------------------------------------


def lua_library() -> str:
    """lua/tb.lua as shipped in this package: the FUNCTION library text."""
    return resources.files("redis_tb").joinpath("tb.lua").read_text(encoding="utf-8")


def lua_script() -> str:
    """The EVAL form: the same text without its first (`#!lua`) line."""
    text = lua_library()
    return text[text.index("\n") + 1 :]


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# --- limits and decisions ----------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """One bucket of a `take_all` call: `n` tokens from `key` (burst
    `capacity`, `rate` tokens per second). `policy` is its name in the
    headers (default ``limit<index>``). Checked when created."""

    key: str
    capacity: Number
    rate: Number
    n: Number = 1
    policy: Optional[str] = None
    #: Lockout (docs/clients.md#lockout): a denied take locks the key for
    #: block_ms, doubling within a probation up to max_block_ms (default
    #: block_ms: no growth). Sent as BLOCK/MAXBLOCK on its takes.
    block_ms: Optional[int] = None
    max_block_ms: Optional[int] = None

    def __post_init__(self):
        check_key(self.key)
        numbers = limit_numbers(self.capacity, self.rate, self.n)
        if self.policy is not None:
            check_name(self.policy)
        lockout = lockout_options(self.block_ms, self.max_block_ms)
        # Checked once, here: the texts a call sends and its plain take are
        # kept (not fields: no part of eq, repr or replace) so that no call
        # checks or formats a Limit again.
        object.__setattr__(self, "_numbers", numbers)
        object.__setattr__(self, "_lockout", lockout)
        object.__setattr__(self, "_take", Call("take", (self.key,), (numbers,),
                                               ((self.policy or "default", self.capacity, self.rate),), lockout))

    @property
    def lockout(self) -> Tuple[str, ...]:
        """``BLOCK ms [MAXBLOCK ms]`` as sent, or () without a lockout."""
        return self._lockout


@dataclass(frozen=True)
class Policy:
    """A limit without a key, for the middleware: the key comes from the
    request. `name` defaults to ``default`` (one policy) or ``limit<index>``.
    Checked when created: a policy that cannot limit is refused
    (`InvalidArgument`), it never reaches a server."""

    capacity: Number
    rate: Number
    name: Optional[str] = None

    def __post_init__(self):
        limit_numbers(self.capacity, self.rate, 0)
        if self.name is not None:
            check_name(self.name)


@dataclass(frozen=True)
class Concurrency:
    """An in-flight limit for the middleware: at most `limit` requests of
    one key at once, each holding a lease (docs/leases.md) from its start
    until its response is finished, renewed every lease_ms/3 while it runs
    (a crashed process's leases end `lease_ms` after their last renewal).
    `name` (default ``inflight``) names it in ``RateLimit-Policy`` and in
    its key ``<prefix>{<id>}:<name>``; `status` is the denial's, 429
    (default) or 503. Checked when created."""

    limit: int
    lease_ms: int = 60_000
    name: str = "inflight"
    status: int = 429

    def __post_init__(self):
        whole_text(self.limit, "limit")
        whole_text(self.lease_ms, "lease_ms")
        check_name(self.name)
        if self.status not in (429, 503):
            raise InvalidArgument(f"a Concurrency status must be 429 or 503, not {self.status!r}")


def limit_numbers(capacity: Number, rate: Number, n: Number) -> Tuple[str, str, str]:
    return (
        number_text(capacity, "capacity", positive=True),
        number_text(rate, "rate", positive=True),
        number_text(n, "n", positive=False),
    )


def _sf_int(x: int) -> int:
    return max(-_SF_INT_MAX, min(_SF_INT_MAX, x))


def _sf_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ceil_div_1000(ms: int) -> int:
    return -(-ms // 1000)


def policy_item(name: str, capacity: Number, rate: Number) -> str:
    """One RateLimit-Policy item: ``"name";q=floor(capacity);w=ceil(capacity/rate)``."""
    quota = math.floor(capacity)
    ratio = capacity / rate
    window = math.ceil(ratio) if math.isfinite(ratio) else _SF_INT_MAX
    return f"{_sf_string(name)};q={_sf_int(quota)};w={_sf_int(window)}"


@dataclass(frozen=True)
class Decision:
    """The server's answer, with the limit(s) it was judged with.

    allowed:        the tokens were taken (peek: would be)
    remaining:      whole tokens left (when denied: available now)
    retry_after_ms: denied: the shortest wait after which the same call
                    would succeed (a lock's end included); -1 if it never
                    can (n > capacity). Allowed: 0, or (a reservation, a
                    charge into debt) the wait before acting: `wait_ms`
    reset_after_ms: until the bucket is full again
    policy, capacity, rate: the deciding limit
    index:          take_all only: position of the deciding limit, else None
    limits:         every (policy, capacity, rate) of the call, in order
    source:         where it came from: "server" (Redis), "local" (the local
                    limiter, during an outage) or "cache" (the denial cache)
    """

    allowed: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    index: Optional[int] = None
    capacity: Number = 0
    rate: Number = 0
    policy: str = "default"
    limits: Tuple[Tuple[str, Number, Number], ...] = field(default=(), compare=True)
    source: str = "server"

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds until the same call would be allowed; None when allowed
        or when waiting can never help."""
        if self.allowed or self.retry_after_ms < 0:
            return None
        return self.retry_after_ms / 1000

    @property
    def wait_ms(self) -> int:
        """On an allowed decision, the ms to wait before acting: > 0 for a
        reservation (take with max_wait_ms) or a charge that left debt
        (until it is repaid), 0 for a plain grant. 0 on a denial (see
        retry_after_ms)."""
        return self.retry_after_ms if self.allowed and self.retry_after_ms > 0 else 0

    def headers(self) -> dict:
        """draft-ietf-httpapi-ratelimit-headers-11 response headers::

            RateLimit-Policy: "<name>";q=<floor(capacity)>;w=<ceil(capacity/rate)>[, ...]
            RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms/1000)>
            Retry-After: <ceil(retry_after_ms/1000)>   (denied, retry_after_ms >= 0)
        """
        limits = self.limits or ((self.policy, self.capacity, self.rate),)
        out = {
            "RateLimit-Policy": ", ".join(policy_item(*lim) for lim in limits),
            "RateLimit": (
                f"{_sf_string(self.policy)};r={_sf_int(self.remaining)};"
                f"t={_sf_int(_ceil_div_1000(self.reset_after_ms))}"
            ),
        }
        if not self.allowed and self.retry_after_ms >= 0:
            out["Retry-After"] = str(_ceil_div_1000(self.retry_after_ms))
        return out


def quick_decision(allowed, remaining, retry_after_ms, reset_after_ms, index, capacity, rate, policy, limits,
                   source) -> Decision:
    """`Decision(...)` of trusted fields at a third of the cost (a frozen
    dataclass sets each field through object.__setattr__): the local
    limiter and the denial cache answer in a few microseconds, so this is
    most of their time."""
    d = object.__new__(Decision)
    d.__dict__.update(allowed=allowed, remaining=remaining, retry_after_ms=retry_after_ms,
                      reset_after_ms=reset_after_ms, index=index, capacity=capacity, rate=rate, policy=policy,
                      limits=limits, source=source)
    return d


@dataclass(frozen=True)
class Lease:
    """The answer of `acquire` / `wait_acquire` (docs/leases.md).

    acquired:       a lease was granted (or, `failed_open`, the limiter was
                    unavailable and the call was let through without one)
    available:      free slots left after this call (limit - live - waiting)
    retry_after_ms: 0 when acquired; else until the earliest live lease ends
                    by itself (a release may free a slot sooner)
    lease:          the lease id to release/renew; None when not acquired,
                    and when failed open (there is nothing to release)
    failed_open:    True only for a `fail_open=True` call that met an
                    unavailable limiter: proceed, but nothing limits you
    key, limit, lease_ms, policy: what the call asked for
    """

    acquired: bool
    available: int
    retry_after_ms: int
    lease: Optional[str]
    key: str = ""
    limit: int = 0
    lease_ms: int = 0
    policy: str = "default"
    failed_open: bool = False

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds until a slot frees up by itself; None when acquired."""
        return None if self.acquired else self.retry_after_ms / 1000

    def headers(self) -> dict:
        """``RateLimit-Policy: "<name>";q=<limit>;qu="concurrent-requests"``,
        and on a denial ``Retry-After: <ceil(retry_after_ms/1000)>`` (at least
        1: a denial with retry_after_ms 0 means others wait ahead). A
        failed-open decision has no headers."""
        if self.failed_open:
            return {}
        out = {"RateLimit-Policy": concurrency_item(self.policy, self.limit)}
        if not self.acquired:
            out["Retry-After"] = str(max(1, _ceil_div_1000(self.retry_after_ms)))
        return out


def concurrency_item(name: str, limit: int) -> str:
    return f'{_sf_string(name)};q={_sf_int(int(limit))};qu="concurrent-requests"'


def failed_open_lease(call: "Call") -> Lease:
    """What a `fail_open=True` acquire answers when the limiter is unavailable."""
    policy, limit, lease_ms = call.limits[0]
    return Lease(True, 0, 0, None, call.keys[0], limit, lease_ms, policy, failed_open=True)


# --- commands per backend ----------------------------------------------------

_MODULE_COMMANDS = {
    "take": "TB.TAKE", "peek": "TB.PEEK", "refund": "TB.REFUND", "takeall": "TB.TAKEALL",
    "acquire": "TB.ACQUIRE", "release": "TB.RELEASE", "renew": "TB.RENEW",
    "charge": "TB.CHARGE", "unblock": "TB.UNBLOCK",
}
_FUNCTIONS = {
    "take": "tb_take", "peek": "tb_peek", "refund": "tb_refund", "takeall": "tb_takeall",
    "acquire": "tb_acquire", "release": "tb_release", "renew": "tb_renew",
    "charge": "tb_charge", "unblock": "tb_unblock",
}


@dataclass(frozen=True)
class Call:
    """One request, backend-neutral: `keys` and per-key `(capacity, rate, n)`
    texts, plus what the Decision needs."""

    op: str  # take | peek | refund | takeall | charge | unblock | acquire | release | renew
    keys: Tuple[str, ...]
    numbers: Tuple[Tuple[str, ...], ...]  # acquire: (limit, lease_ms); release: (id,); renew: (id, lease_ms)
    limits: Tuple[Tuple[str, Number, Number], ...]  # (policy, capacity, rate); acquire: (policy, limit, lease_ms)
    options: Tuple[str, ...] = ()  # after the numbers: MAXWAIT/BLOCK/MAXBLOCK (take, takeall), MAXDEBT (charge)
    #: Sent again once after a dropped connection (docs/clients.md#a-dropped-connection-is-not-an-outage):
    #: all but refunds and settles, which could hand out tokens twice.
    retry: bool = True

    def with_options(self, options: Tuple[str, ...]) -> "Call":
        return dataclasses.replace(self, options=options)

    @functools.cached_property
    def amounts(self) -> Tuple[float, ...]:
        """Each bucket's n as a float (a take, peek, refund, charge or
        take_all), parsed once per Call for the local answers."""
        return tuple(float(nums[2]) for nums in self.numbers)


#: The calls `single` built without options, by their arguments: a key
#: taken again is neither checked nor formatted again (the local limiter
#: and the denial cache answer in about the time the checks took). Each
#: entry keeps the numbers' types too: True == 1 and Decimal(1) == 1 hash
#: alike, and must still be refused. Emptied when full, so it stays small.
_CALLS: dict = {}
_CALLS_MAX = 4096


def single(op: str, key: str, capacity: Number, rate: Number, n: Number, policy: str,
           options: Tuple[str, ...] = ()) -> Call:
    memo = None
    if not options:
        memo = (op, key, capacity, rate, n, policy)
        try:
            known = _CALLS.get(memo)
        except TypeError:  # an unhashable argument: the checks below refuse it
            known = memo = None
        if known is not None and known[1] is type(capacity) and known[2] is type(rate) and known[3] is type(n):
            return known[0]
    check_key(key)
    check_name(policy)
    call = Call(op, (key,), (limit_numbers(capacity, rate, n),), ((policy, capacity, rate),), options, op != "refund")
    if memo is not None:
        if len(_CALLS) >= _CALLS_MAX:
            _CALLS.clear()
        _CALLS[memo] = (call, type(capacity), type(rate), type(n))
    return call


def take(key: str, capacity: Number, rate: Number, n: Number, policy: str, max_wait_ms=None, block_ms=None,
         max_block_ms=None) -> Call:
    """TB.TAKE with its options, for both limiters' `take` (without an
    option: no option checks, the memoised call)."""
    call = single("take", key, capacity, rate, n, policy)
    if max_wait_ms is None and block_ms is None and max_block_ms is None:
        return call
    # The options after the numbers: a bad value is named in the server's order.
    return call.with_options(take_options(max_wait_ms, block_ms, max_block_ms))


def _limit(limit) -> Limit:
    if not isinstance(limit, Limit):
        raise InvalidArgument(f"expected a Limit, not {type(limit).__name__}")
    return limit


def limit_take(limit: Limit, max_wait_ms=None) -> Call:
    """TB.TAKE of one Limit, with its lockout and the reservation (the
    Limit was checked when created, and keeps its plain take)."""
    limit = _limit(limit)
    if max_wait_ms is None:
        return limit._take
    options = take_options(max_wait_ms)
    if not options:
        return limit._take
    return limit._take.with_options(options + limit._lockout)


def charge(limit: Limit, n: Number, max_debt: Optional[Number]) -> Call:
    """TB.CHARGE limit.key capacity rate n [MAXDEBT d]: a cost learned after
    the work, always taken, into debt down to -max_debt (default capacity)."""
    limit = _limit(limit)
    call = single("charge", limit.key, limit.capacity, limit.rate, n, limit.policy or "default")
    if max_debt is None:
        return call
    # MAXDEBT after n: a bad value is named in the server's order.
    return call.with_options(("MAXDEBT", number_text(max_debt, "max_debt", positive=False)))


def settle(limit: Limit, reserved: Number, actual: Number) -> Optional[Call]:
    """The one call that turns a take of `reserved` into a cost of `actual`:
    TB.REFUND of reserved - actual, TB.CHARGE of actual - reserved, or None
    (nothing to send) when they are equal."""
    limit = _limit(limit)
    number_text(reserved, "reserved", positive=False)
    number_text(actual, "actual", positive=False)
    policy = limit.policy or "default"
    if actual < reserved:
        call = single("refund", limit.key, limit.capacity, limit.rate, reserved - actual, policy)
    elif actual > reserved:
        call = single("charge", limit.key, limit.capacity, limit.rate, actual - reserved, policy)
    else:
        return None
    return dataclasses.replace(call, retry=False)


def unblock(limit_or_key) -> Call:
    """TB.UNBLOCK key: forget the key's lock and strikes."""
    key = limit_or_key.key if isinstance(limit_or_key, Limit) else limit_or_key
    return Call("unblock", (check_key(key),), ((),), ())


def acquire(key: str, limit, lease_ms, policy: str) -> Call:
    check_key(key)
    check_name(policy)
    texts = (whole_text(limit, "limit"), whole_text(lease_ms, "lease_ms"))
    return Call("acquire", (key,), (texts,), ((policy, int(texts[0]), int(texts[1])),))


def release(key: str, lease: str) -> Call:
    return Call("release", (check_key(key),), ((lease,),), ())


def renew(key: str, lease: str, lease_ms) -> Call:
    return Call("renew", (check_key(key),), ((lease, whole_text(lease_ms, "lease_ms")),), ())


def take_all(limits: Sequence[Limit], max_wait_ms=None) -> Call:
    """TB.TAKEALL of `limits`. Its options apply to every bucket, so the
    limits' lockouts must be the same (all without, or all with the same
    block_ms and max_block_ms)."""
    limits = list(limits)
    if not limits:
        raise InvalidArgument("take_all needs at least one Limit")
    keys, nums, named = [], [], []
    for i, lim in enumerate(limits):
        if not isinstance(lim, Limit):
            raise InvalidArgument(f"take_all takes Limit objects, not {type(lim).__name__}")
        keys.append(lim.key)
        nums.append(lim._numbers)  # checked when the Limit was created
        named.append((lim.policy or f"limit{i}", lim.capacity, lim.rate))
    lockouts = {lim._lockout for lim in limits}
    if len(lockouts) > 1:
        raise InvalidArgument("take_all: every Limit must have the same block_ms and max_block_ms "
                              "(TB.TAKEALL's BLOCK applies to every bucket)")
    options = take_options(max_wait_ms) + lockouts.pop()
    return Call("takeall", tuple(keys), tuple(nums), tuple(named), options)


def command(backend: str, call: Call, sha: str) -> list:
    """The command for `call` on `backend` ("module", "function", "script").
    peek is FCALL_RO on the function backend, so it may run on a replica."""
    flat = [x for nums in call.numbers for x in nums] + list(call.options)
    if backend == "module":
        if call.op == "takeall":
            args = []
            for key, nums in zip(call.keys, call.numbers):
                args += [key, *nums]
            return ["TB.TAKEALL", *args, *call.options]
        return [_MODULE_COMMANDS[call.op], call.keys[0], *flat]
    if backend == "function":
        fcall = "FCALL_RO" if call.op == "peek" else "FCALL"
        return [fcall, _FUNCTIONS[call.op], len(call.keys), *call.keys, *flat]
    if backend == "script":
        return ["EVALSHA", sha, len(call.keys), *call.keys, call.op, *flat]
    raise ValueError(f"unknown backend {backend!r}")


def btake_command(key: str, nums: Tuple[str, str, str], timeout_ms: int) -> list:
    return ["TB.BTAKE", key, *nums, str(timeout_ms)]


def blocking_command(call: Call, timeout_ms: int) -> list:
    """The waiting form of `call` on the module: TB.BTAKE for a take,
    TB.ACQUIRE with timeout_ms for an acquire."""
    if call.op == "acquire":
        return ["TB.ACQUIRE", call.keys[0], *call.numbers[0], str(timeout_ms)]
    return btake_command(call.keys[0], call.numbers[0], timeout_ms)


def result(call: Call, reply):
    """What a call answers: a Decision (buckets), a Lease (acquire), a
    bool (release, renew)."""
    if call.op == "acquire":
        return lease_decision(call, reply)
    if call.op in ("release", "renew", "unblock"):
        if isinstance(reply, int) and not isinstance(reply, bool) and reply in (0, 1):
            return reply == 1
        raise LimiterError(f"unexpected reply {reply!r}")
    return decision(call, reply)


def lease_decision(call: Call, reply) -> Lease:
    """A Lease from ``[acquired, available, retry_after_ms, id or nil]``."""
    ok = isinstance(reply, (list, tuple)) and len(reply) == 4
    if ok:
        acquired, available, retry, ident = reply
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (acquired, available, retry))
        ok = ok and acquired in (0, 1) and ((ident is None) == (acquired == 0))
        ok = ok and (ident is None or isinstance(ident, (bytes, str)))
    if not ok:
        raise LimiterError(f"unexpected reply {reply!r}")
    if isinstance(ident, bytes):
        ident = ident.decode("utf-8", "surrogateescape")
    policy, limit, lease_ms = call.limits[0]
    return Lease(acquired == 1, available, retry, ident, call.keys[0], limit, lease_ms, policy)


def decision(call: Call, reply) -> Decision:
    """The Decision of a reply; a reply of another shape is a bug
    (LimiterError), never an outage."""
    try:
        values = [int(x) for x in reply]
    except (TypeError, ValueError):
        raise LimiterError(f"unexpected reply {reply!r}") from None
    if len(values) not in (4, 5):
        raise LimiterError(f"unexpected reply {reply!r}")
    index = values[4] if call.op == "takeall" and len(values) == 5 else None
    if index is not None and not 0 <= index < len(call.limits):
        raise LimiterError(f"unexpected reply {reply!r}")
    policy, capacity, rate = call.limits[index or 0]
    return Decision(
        allowed=values[0] == 1,
        remaining=values[1],
        retry_after_ms=values[2],
        reset_after_ms=values[3],
        index=index,
        capacity=capacity,
        rate=rate,
        policy=policy,
        limits=call.limits if call.op == "takeall" else (),
    )


# --- the most-denied keys (TB.TOP) -------------------------------------------


@dataclass(frozen=True)
class TopKey:
    """One row of `top()` (docs/clients.md#the-most-denied-keys).

    key:       the key's name as text (bytes that are not UTF-8 as U+FFFD)
    key_bytes: its bytes, exactly
    count:     denials counted, at most `error` above the true number
    error:     the bound on the overcount
    shadow:    how many of them were shadow-mode denials
    truncated: the name was cut at 256 bytes (keys sharing those share the row)
    """

    key: str
    key_bytes: bytes
    count: int
    error: int
    shadow: int
    truncated: bool


def top_command(count) -> Tuple[str, ...]:
    """TB.TOP COUNT count; count is a whole number from 1 to 2^53, as the server takes it."""
    return ("TB.TOP", "COUNT", whole_text(count, "count"))


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def top_key(row) -> TopKey:
    """A TopKey of a ``[key, count, error, shadow, truncated]`` row."""
    ok = isinstance(row, (list, tuple)) and len(row) == 5
    if ok:
        name, count, error, shadow, truncated = row
        ok = isinstance(name, (bytes, str)) and all(_is_int(x) for x in (count, error, shadow)) \
            and truncated in (0, 1) and not isinstance(truncated, bool)
    if not ok:
        raise LimiterError(f"unexpected TB.TOP row {row!r}")
    raw = name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")
    return TopKey(raw.decode("utf-8", "replace"), raw, count, error, shadow, truncated == 1)


def top_rows(replies, count: int) -> List[TopKey]:
    """The rows of every node's TB.TOP reply, merged: the most denied
    first, ties by key bytes, the first `count`. A tie of counts is
    ordered by `error` first, as each server orders its own rows
    (core/src/top.rs): a node cuts its answer at `count` in that order, so
    the merge must follow it to be the deployment's first `count`. The
    nodes own disjoint keys, so no row is merged twice."""
    rows = []
    for reply in replies:
        if not isinstance(reply, (list, tuple)):
            raise LimiterError(f"unexpected TB.TOP reply {reply!r}")
        rows.extend(top_key(row) for row in reply)
    rows.sort(key=lambda r: (-r.count, r.error, r.key_bytes))
    return rows[:count]


def module_present(reply) -> bool:
    """Does a `COMMAND INFO tb.take` reply describe a command?"""
    if not reply:
        return False
    if isinstance(reply, dict):  # redis-py may parse it into {name: info}
        return any(v for v in reply.values())
    if isinstance(reply, (list, tuple)):
        return any(entry for entry in reply)
    return bool(reply)


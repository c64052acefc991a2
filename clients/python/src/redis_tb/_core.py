"""The plain parts both limiters share: errors and the failure rule,
arguments, keys, commands, replies, decisions and headers.

Nothing here does I/O; `_engine` strings these together into calls, and
`RateLimiter` / `AsyncRateLimiter` only send what it asks for.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import numbers
from dataclasses import dataclass, field
from importlib import resources
from typing import Optional, Sequence, Tuple, Union

import redis.exceptions as rex

Number = Union[int, float]

BACKENDS = ("module", "function", "script")

#: Added to timeout_ms for the socket read timeout of TB.BTAKE, so the server
#: answers (a denial on its own timeout) before the client gives up.
BLOCKING_MARGIN_S = 1.0

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


#: The name of InvalidArgument in 0.1.0 (numbers only).
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
    non-negative (n). A bad value is refused here, before anything is sent."""
    kind = type(value)
    if kind is int or kind is float:  # the usual case, without the (slow) ABC checks below
        x = value
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{what} must be an int or a float, not {type(value).__name__}")
    else:
        x = value if isinstance(value, numbers.Integral) else float(value)
    if not math.isfinite(x):
        raise InvalidArgument(f"{what} must be a finite number, not {x!r}")
    if positive and x <= 0:
        raise InvalidArgument(f"{what} must be a positive finite number, not {x!r}")
    if x < 0:
        raise InvalidArgument(f"{what} must be a non-negative finite number, not {x!r}")
    if what != "rate" and x > MAX_AMOUNT:
        raise InvalidArgument(f"{what} must be at most {MAX_AMOUNT} (2^53), not {x!r}")
    if isinstance(x, int):
        return str(int(x))
    if x == int(x) and x < 1e16:
        return str(int(x))  # 20.0 -> "20": same value, shorter text
    return repr(x)


def check_key(key) -> str:
    if not isinstance(key, (str, bytes)) or not key:
        raise InvalidArgument(f"a key must be a non-empty str, not {key!r}")
    return key


def check_name(name) -> str:
    if not isinstance(name, str) or not name or any(not (0x20 <= ord(c) <= 0x7E) for c in name):
        raise InvalidArgument(f"a policy name must be non-empty printable ASCII, not {name!r}")
    return name


def check_timeout_ms(timeout_ms) -> int:
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, numbers.Real):
        raise InvalidArgument("timeout_ms must be a number of milliseconds")
    if not math.isfinite(timeout_ms) or timeout_ms < 0:
        raise InvalidArgument("timeout_ms must be a finite number >= 0 (0: no limit)")
    return int(math.ceil(timeout_ms))


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

    def __post_init__(self):
        check_key(self.key)
        limit_numbers(self.capacity, self.rate, self.n)
        if self.policy is not None:
            check_name(self.policy)


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
    retry_after_ms: 0 when allowed; the shortest wait after which the same
                    call would succeed; -1 if it never can (n > capacity)
    reset_after_ms: until the bucket is full again
    policy, capacity, rate: the deciding limit
    index:          take_all only: position of the deciding limit, else None
    limits:         every (policy, capacity, rate) of the call, in order
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

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds until the same call would be allowed; None when allowed
        or when waiting can never help."""
        if self.allowed or self.retry_after_ms < 0:
            return None
        return self.retry_after_ms / 1000

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


# --- commands per backend ----------------------------------------------------

_MODULE_COMMANDS = {"take": "TB.TAKE", "peek": "TB.PEEK", "refund": "TB.REFUND", "takeall": "TB.TAKEALL"}
_FUNCTIONS = {"take": "tb_take", "peek": "tb_peek", "refund": "tb_refund", "takeall": "tb_takeall"}


@dataclass(frozen=True)
class Call:
    """One request, backend-neutral: `keys` and per-key `(capacity, rate, n)`
    texts, plus what the Decision needs."""

    op: str  # take | peek | refund | takeall
    keys: Tuple[str, ...]
    numbers: Tuple[Tuple[str, str, str], ...]
    limits: Tuple[Tuple[str, Number, Number], ...]  # (policy, capacity, rate)


def single(op: str, key: str, capacity: Number, rate: Number, n: Number, policy: str) -> Call:
    check_key(key)
    check_name(policy)
    return Call(op, (key,), (limit_numbers(capacity, rate, n),), ((policy, capacity, rate),))


def take_all(limits: Sequence[Limit]) -> Call:
    limits = list(limits)
    if not limits:
        raise InvalidArgument("take_all needs at least one Limit")
    keys, nums, named = [], [], []
    for i, lim in enumerate(limits):
        if not isinstance(lim, Limit):
            raise InvalidArgument(f"take_all takes Limit objects, not {type(lim).__name__}")
        keys.append(lim.key)
        nums.append(limit_numbers(lim.capacity, lim.rate, lim.n))
        named.append((lim.policy or f"limit{i}", lim.capacity, lim.rate))
    return Call("takeall", tuple(keys), tuple(nums), tuple(named))


def command(backend: str, call: Call, sha: str) -> list:
    """The command for `call` on `backend` ("module", "function", "script").
    peek is FCALL_RO on the function backend, so it may run on a replica."""
    flat = [x for nums in call.numbers for x in nums]
    if backend == "module":
        if call.op == "takeall":
            args = []
            for key, nums in zip(call.keys, call.numbers):
                args += [key, *nums]
            return ["TB.TAKEALL", *args]
        return [_MODULE_COMMANDS[call.op], call.keys[0], *flat]
    if backend == "function":
        fcall = "FCALL_RO" if call.op == "peek" else "FCALL"
        return [fcall, _FUNCTIONS[call.op], len(call.keys), *call.keys, *flat]
    if backend == "script":
        return ["EVALSHA", sha, len(call.keys), *call.keys, call.op, *flat]
    raise ValueError(f"unknown backend {backend!r}")


def btake_command(key: str, nums: Tuple[str, str, str], timeout_ms: int) -> list:
    return ["TB.BTAKE", key, *nums, str(timeout_ms)]


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


def module_present(reply) -> bool:
    """Does a `COMMAND INFO tb.take` reply describe a command?"""
    if not reply:
        return False
    if isinstance(reply, dict):  # redis-py may parse it into {name: info}
        return any(v for v in reply.values())
    if isinstance(reply, (list, tuple)):
        return any(entry for entry in reply)
    return bool(reply)


def redirection(error: BaseException) -> Optional[Tuple[str, str, int]]:
    """("MOVED" | "ASK", host, port) of a redirection reply, else None."""
    if not isinstance(error, rex.ResponseError):
        return None
    parts = reply_text(error).split(" ")
    if len(parts) != 3 or parts[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = parts[2].rpartition(":")
    return parts[0], host, int(port)

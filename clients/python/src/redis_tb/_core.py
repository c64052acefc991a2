"""What the sync and async limiters share: numbers, commands, replies, errors.

Nothing here does I/O. `RateLimiter` and `AsyncRateLimiter` build the
command for a backend with `command()`, send it, and turn the reply into a
`Decision` with `decision()`.
"""

from __future__ import annotations

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

# Structured Fields integers have at most 15 digits (RFC 8941 3.3.1).
_SF_INT_MAX = 999_999_999_999_999


# --- errors ------------------------------------------------------------------


class LimiterError(Exception):
    """Base class of every error this library raises."""


class InvalidNumber(LimiterError, ValueError):
    """capacity, rate or n is not a finite number (raised before sending)."""


class LimiterUnavailable(LimiterError):
    """Redis could not be reached, timed out, or failed in a way that says
    nothing about the request (connection refused, timeout, LOADING, ...).
    The middleware fails open (or closed) on these; `__cause__` is the
    redis-py exception."""


class LimiterReplyError(LimiterError):
    """The server answered the command with an error reply, e.g.
    ``ERR rate must be a positive finite number`` or ``WRONGTYPE ...``.
    `message` is the server's full text, identical for the module and the
    Lua fallback."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def reply_text(error: rex.ResponseError) -> str:
    """The server's error text as it was sent (redis-py strips a known
    prefix such as ``ERR `` and keeps it in `status_code`)."""
    text = str(error)
    code = getattr(error, "status_code", None)
    if code and not text.startswith(code + " "):
        text = f"{code} {text}"
    return text


def translate(error: Exception) -> LimiterError:
    """A redis-py exception as this library's error."""
    if isinstance(error, LimiterError):
        return error
    if isinstance(error, rex.ResponseError) and not isinstance(
        error,
        (rex.ReadOnlyError, rex.ClusterDownError, rex.TryAgainError, rex.MasterDownError),
    ):
        return LimiterReplyError(reply_text(error))
    return LimiterUnavailable(f"{type(error).__name__}: {error}")


# --- numbers -----------------------------------------------------------------


def number_text(value: Number, what: str) -> str:
    """The shortest exact decimal text of `value`: str() of an int,
    repr() of a float (Python's repr is the shortest round-tripping text).
    NaN and infinities are refused here, before anything is sent; negative
    or zero values go to the server, which answers with its own error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidNumber(f"{what} must be an int or a float, not {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    x = float(value)
    if not math.isfinite(x):
        raise InvalidNumber(f"{what} must be a finite number, not {x!r}")
    if x == int(x) and abs(x) < 1e16:
        return str(int(x))  # 20.0 -> "20": same value, shorter text
    return repr(x)


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


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or any(not (0x20 <= ord(c) <= 0x7E) for c in name):
        raise ValueError(f"a policy name must be non-empty printable ASCII, not {name!r}")
    return name


@dataclass(frozen=True)
class Limit:
    """One bucket of a `take_all` call: `n` tokens from `key` (burst
    `capacity`, `rate` tokens per second). `name` is the policy name in the
    headers (default ``limit<index>``)."""

    key: str
    capacity: Number
    rate: Number
    n: Number = 1
    name: Optional[str] = None

    def __post_init__(self):
        if self.name is not None:
            _check_name(self.name)


@dataclass(frozen=True)
class Policy:
    """A limit without a key, for the middleware: the key comes from the
    request. `name` defaults to ``default`` (one policy) or ``limit<index>``."""

    capacity: Number
    rate: Number
    name: Optional[str] = None

    def __post_init__(self):
        number_text(self.capacity, "capacity")
        number_text(self.rate, "rate")
        if self.name is not None:
            _check_name(self.name)


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
    index:          take_all only: position of the deciding limit, else None
    capacity, rate, name: the deciding limit
    limits:         every (name, capacity, rate) of the call, in order
    """

    allowed: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    index: Optional[int] = None
    capacity: Number = 0
    rate: Number = 0
    name: str = "default"
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
        limits = self.limits or ((self.name, self.capacity, self.rate),)
        out = {
            "RateLimit-Policy": ", ".join(policy_item(*lim) for lim in limits),
            "RateLimit": (
                f"{_sf_string(self.name)};r={_sf_int(self.remaining)};"
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
    limits: Tuple[Tuple[str, Number, Number], ...]  # (name, capacity, rate)


def single(op: str, key: str, capacity: Number, rate: Number, n: Number, name: str) -> Call:
    _check_name(name)
    nums = (number_text(capacity, "capacity"), number_text(rate, "rate"), number_text(n, "n"))
    return Call(op, (key,), (nums,), ((name, capacity, rate),))


def take_all(limits: Sequence[Limit]) -> Call:
    limits = list(limits)
    if not limits:
        raise ValueError("take_all needs at least one Limit")
    keys, nums, named = [], [], []
    for i, lim in enumerate(limits):
        if not isinstance(lim, Limit):
            raise TypeError(f"take_all takes Limit objects, not {type(lim).__name__}")
        keys.append(lim.key)
        nums.append(
            (number_text(lim.capacity, "capacity"), number_text(lim.rate, "rate"), number_text(lim.n, "n"))
        )
        named.append((lim.name or f"limit{i}", lim.capacity, lim.rate))
    return Call("takeall", tuple(keys), tuple(nums), tuple(named))


def command(backend: str, call: Call, sha: str) -> list:
    """The command for `call` on `backend` ("module", "function", "script")."""
    flat = [x for nums in call.numbers for x in nums]
    if backend == "module":
        if call.op == "takeall":
            args = []
            for key, nums in zip(call.keys, call.numbers):
                args += [key, *nums]
            return ["TB.TAKEALL", *args]
        return [_MODULE_COMMANDS[call.op], call.keys[0], *flat]
    if backend == "function":
        return ["FCALL", _FUNCTIONS[call.op], len(call.keys), *call.keys, *flat]
    if backend == "script":
        return ["EVALSHA", sha, len(call.keys), *call.keys, call.op, *flat]
    raise ValueError(f"unknown backend {backend!r}")


def eval_command(call: Call, script: str) -> list:
    """The script call with its full text (after NOSCRIPT): EVAL also caches
    the script on the node that ran it."""
    flat = [x for nums in call.numbers for x in nums]
    return ["EVAL", script, len(call.keys), *call.keys, call.op, *flat]


def btake_command(key: str, nums: Tuple[str, str, str], timeout_ms: int) -> list:
    return ["TB.BTAKE", key, *nums, str(timeout_ms)]


def decision(call: Call, reply) -> Decision:
    try:
        values = [int(x) for x in reply]
    except (TypeError, ValueError):
        raise LimiterUnavailable(f"unexpected reply {reply!r}") from None
    if len(values) not in (4, 5):
        raise LimiterUnavailable(f"unexpected reply {reply!r}")
    index = values[4] if call.op == "takeall" and len(values) == 5 else None
    name, capacity, rate = call.limits[index or 0]
    return Decision(
        allowed=values[0] == 1,
        remaining=values[1],
        retry_after_ms=values[2],
        reset_after_ms=values[3],
        index=index,
        capacity=capacity,
        rate=rate,
        name=name,
        limits=call.limits if call.op == "takeall" else (),
    )


def check_timeout_ms(timeout_ms) -> int:
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, numbers.Real):
        raise InvalidNumber("timeout_ms must be a number of milliseconds")
    if not math.isfinite(timeout_ms) or timeout_ms < 0:
        raise InvalidNumber("timeout_ms must be a finite number >= 0 (0: no limit)")
    return int(math.ceil(timeout_ms))


def module_present(reply) -> bool:
    """Does a `COMMAND INFO tb.take` reply describe a command?"""
    if not reply:
        return False
    if isinstance(reply, dict):  # redis-py may parse it into {name: info}
        return any(v for v in reply.values())
    if isinstance(reply, (list, tuple)):
        return any(entry for entry in reply)
    return bool(reply)

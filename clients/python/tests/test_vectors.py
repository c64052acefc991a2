"""The core's vectors (clients/conformance/vectors/, written by the pure core)
replayed against the rules this library writes again, without a server: the
bucket's take (take.json; peek.json without a lock), take_all (takeall.json
without options), first_ms_when and the denial cache's priming window. Each
vector's stored state, limit, n and clock go in; the reply figures and the
state written must come out exactly (the doubles bit for bit).

And the argument rules (args.json), through the limiter's own calls on a
server with the module: what the core refuses, the limiter refuses before
sending (InvalidArgument, naming the same argument, and 2^53 when the value
is above it); what the core accepts, the limiter sends and the server
accepts."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import pytest
import redis

from redis_tb import InvalidArgument, Limit, RateLimiter, _local

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "vectors"


def vectors(rule, keep=lambda v: True):
    found = [v for v in json.loads((VECTORS / f"{rule}.json").read_text())["vectors"] if keep(v)]
    assert found, f"no vectors in {rule}.json"
    return pytest.mark.parametrize("vector", found, ids=[v["name"] for v in found])


def stored(state):
    """A vector's stored bucket as the local limiter keeps one: (tokens, last_refill_ms)."""
    return None if state is None else (state["tokens"], state["last_refill_ms"])


def reply_of(allowed, outcome):
    return {"allowed": allowed, "remaining": outcome[1], "retry_after_ms": outcome[2],
            "reset_after_ms": outcome[3]}


def written(write):
    """What the local limiter stores of a vector's write: the tokens and last_refill."""
    return None if write is None else (write["tokens"], write["last_refill_ms"])


def take(vector):
    config = vector["config"]
    return _local.take(stored(vector["state"]), config["capacity"], config["rate"], vector["n"], vector["now_ms"])


@vectors("take")
def test_a_local_take_replies_and_writes_as_the_core(vector):
    outcome = take(vector)
    assert reply_of(outcome[0], outcome) == vector["expect"]["reply"]
    assert outcome[4] == written(vector["expect"]["write"])


@vectors("peek", keep=lambda v: v["state"] is None or "lock" not in v["state"])
def test_a_local_peek_replies_as_the_core(vector):
    outcome = take(vector)
    assert reply_of(outcome[0], outcome) == vector["expect"]["reply"]


@vectors("takeall", keep=lambda v: not v["options"])
def test_a_local_take_all_takes_from_every_bucket_or_none_as_the_core(vector):
    buckets = vector["buckets"]
    limits = [(b["config"]["capacity"], b["config"]["rate"], b["n"]) for b in buckets]
    allowed, index, outcomes = _local.take_all([stored(b["state"]) for b in buckets], limits, vector["now_ms"])
    expect = vector["expect"]
    assert {**reply_of(allowed, outcomes[index]), "index": index} == expect["reply"]
    assert [o[4] for o in outcomes] == [written(w) for w in expect["writes"]]


@vectors("first_ms_when")
def test_first_ms_when_is_the_cores(vector):
    state, config = vector["state"], vector["config"]
    got = _local.first_ms_when(state["tokens"], state["last_refill_ms"], config["capacity"], config["rate"],
                               float(vector["now_ms"]), vector["wanted"])
    assert got == vector["expect"]["ms"]


@vectors("denial_cache")
def test_the_denial_cache_primes_the_cores_window(vector):
    config, reply = vector["config"], vector["reply"]
    got = _local.primed_denial_ms(reply["remaining"], vector["n"], config["capacity"], config["rate"],
                                reply["reset_after_ms"])
    assert got == vector["expect"]["window_ms"]


# --- the argument rules (args.json) ------------------------------------------

DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
DIGITS = re.compile(r"[0-9]+\Z")
MAX = 2**53


class TextOnly(Exception):
    """The vector says something only its text can: a sign on zero, a plus
    sign, hex, padding, 65 bytes, a whole number spelt 1.0 or 1e3, an option
    keyword unknown, repeated or without its value. A caller of this library
    passes numbers and keyword arguments, so it cannot say it."""


def number(text, whole=False):
    """The number a caller passes for the argument `text`, exactly (an int,
    a Fraction, or a float NaN or infinity); `whole`: an argument the server
    takes as plain digits only (MAXWAIT, BLOCK, MAXBLOCK, limit, lease_ms)."""
    special = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "infinity": math.inf, "-inf": -math.inf}
    if text in special:
        return special[text]
    negative = text.startswith("-")
    body = text[1:] if negative else text
    if len(text) > 64 or not DECIMAL.match(body):
        raise TextOnly
    value = int(body) if DIGITS.match(body) else Fraction(body)
    if whole and not DIGITS.match(body) and value == int(value):
        raise TextOnly
    if negative and value == 0:
        raise TextOnly
    return -value if negative else value


TAKE_OPTIONS = {"MAXWAIT": "max_wait_ms", "BLOCK": "block_ms", "MAXBLOCK": "max_block_ms"}


def take_options(words):
    """TB.TAKE's option words as the limiter's keyword arguments."""
    if len(words) % 2:
        raise TextOnly
    options = {}
    for keyword, text in zip(words[::2], words[1::2]):
        name = TAKE_OPTIONS.get(keyword.upper())
        if name is None or name in options:
            raise TextOnly
        options[name] = number(text, whole=True)
    return options


def limiter_call(vector):
    """The RateLimiter call that sends `vector`'s command with its
    arguments, on the key "k": (method, args, kwargs)."""
    command, args = vector["command"], vector["args"]
    if command in ("TB.TAKE", "TB.PEEK", "TB.REFUND", "TB.CHARGE", "TB.BTAKE"):
        numbers = [number(text) for text in args[:3]]
        words = args[3:]
    if command == "TB.TAKE":
        return "take", ("k", *numbers), take_options(words)
    if command in ("TB.PEEK", "TB.REFUND"):
        return command[3:].lower(), ("k", *numbers), {}
    if command == "TB.CHARGE":
        if words and (len(words) != 2 or words[0].upper() != "MAXDEBT"):
            raise TextOnly
        capacity, rate, n = numbers
        max_debt = number(words[1]) if words else None
        return "charge", (lambda: Limit("k", capacity, rate), n), {"max_debt": max_debt}
    if command == "TB.BTAKE":
        return "wait_take", ("k", *numbers), {"timeout_ms": number(args[3])}
    if command == "TB.TAKEALL":
        groups = vector["groups"]
        options = take_options(args[4 * groups:])
        lockout = {name: options.pop(name) for name in ("block_ms", "max_block_ms") if name in options}
        specs = [(args[i], *(number(text) for text in args[i + 1:i + 4])) for i in range(0, 4 * groups, 4)]
        limits = lambda: [Limit(key, c, r, n, **lockout) for key, c, r, n in specs]  # noqa: E731
        return "take_all", (limits,), options
    if command == "TB.ACQUIRE":
        limit, lease_ms = number(args[0], whole=True), number(args[1], whole=True)
        if len(args) == 3:
            return "wait_acquire", ("k", limit, lease_ms), {"timeout_ms": number(args[2])}
        return "acquire", ("k", limit, lease_ms), {}
    if command == "TB.RENEW":
        return "renew", ("k", args[0], number(args[1], whole=True)), {}
    raise TextOnly  # TB.THROTTLE: no call of this library sends it


def checked_here(vector):
    """A vector this library's checks cover: a caller can say it, and the
    core accepts it or refuses an argument (an unknown option and a repeated
    key are the server's to refuse)."""
    try:
        limiter_call(vector)
    except TextOnly:
        return False
    return "error" not in vector["expect"] or vector["expect"]["argument"] is not None


# The limiter's names of the arguments the server's errors name.
NAMES = {"MAXWAIT": "max_wait_ms", "BLOCK": "block_ms", "MAXBLOCK": "max_block_ms", "MAXDEBT": "max_debt"}


@pytest.fixture(scope="module")
def checking_limiter(module_server):
    client = redis.Redis(port=module_server.port)
    limiter = RateLimiter(client)
    yield client, limiter
    limiter.close()
    client.close()


@vectors("args", keep=checked_here)
def test_the_limiter_refuses_what_the_core_refuses_and_sends_what_it_accepts(vector, checking_limiter):
    client, limiter = checking_limiter
    client.flushall()
    method, args, kwargs = limiter_call(vector)
    # A Limit is made in the call, where its own checks raise.
    call = lambda: getattr(limiter, method)(*(arg() if callable(arg) else arg for arg in args), **kwargs)  # noqa: E731
    expect = vector["expect"]
    if "error" not in expect:
        call()  # refused neither here nor by the server
        return
    with pytest.raises(InvalidArgument) as refused:
        call()
    message = str(refused.value)
    argument = expect["argument"]
    name = NAMES.get(argument, argument)
    assert re.match(rf"(?:\S*\.)?{name} (?:must|needs)\b", message), f"{message!r} does not name {name}"
    # Above the bound the server's error states: so must the limiter's.
    above = any(isinstance(value, (int, Fraction)) and value > MAX for value in numbers_in(vector["args"]))
    if above and "2^53" in expect["error"]:
        assert "2^53" in message, f"{message!r} does not say the bound, 2^53"


def numbers_in(texts):
    for text in texts:
        try:
            yield number(text)
        except TextOnly:
            pass

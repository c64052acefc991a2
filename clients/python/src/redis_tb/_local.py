"""What a limiter answers without Redis: the local limiter, the denial cache
and the outage that says when the local limiter answers
(docs/clients.md#when-redis-is-down-the-local-limiter, #the-denial-cache).
Pure: no I/O, no lock; the clock is passed in, so the tests replay
clients/conformance/vectors/local.json on a virtual clock. The engine's
`Shield` holds the three and asks them around each call.

The bucket arithmetic is core/src/bucket.rs's `take`, `take_all` and
`first_ms_when` (which lua/tb.lua follows too), in the same operation
order, so the doubles, and so the answers, are identical.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Optional, Tuple

from ._core import Call, Decision, quick_decision

MAX_EXACT = 2**53
_MAX_EXACT_F = float(MAX_EXACT)
_floor, _ceil = math.floor, math.ceil  # module globals: a local take looks them up without `math.`

# An outcome: (allowed, remaining, retry_after_ms, reset_after_ms, write),
# write the (tokens, last_refill_ms) to store or None.


def wall_ms() -> int:
    """The process's wall clock in whole ms, as the module reads the server's."""
    return time.time_ns() // 1_000_000


def _available(tokens: float, last: float, capacity: float, rate: float, now: float) -> float:
    """bucket.rs `State::available_at`, operation for operation."""
    elapsed = now - last
    if elapsed < 0.0:
        elapsed = 0.0
    if tokens < -_MAX_EXACT_F:
        tokens = -_MAX_EXACT_F
    refilled = tokens + elapsed / 1000.0 * rate
    return capacity if refilled > capacity else refilled


def _clamp_wait(ms: float) -> int:
    if ms != ms or ms >= _MAX_EXACT_F:
        return MAX_EXACT
    return 0 if ms <= 0.0 else int(ms)


def first_ms_when(tokens: float, last: float, capacity: float, rate: float, now: float, wanted: float) -> int:
    """bucket.rs `first_ms_when`: the fewest whole ms w in [0, 2^53] such
    that the bucket holds `wanted` tokens at now + w (2^53 if none does).
    The guess from the deficit is almost always the edge; the gallop and
    the bisection make it exact where rounding is not kind. (`_available`
    is called by name, not through a closure: this runs on every local take.)"""
    available = _available
    now_available = available(tokens, last, capacity, rate, now)
    if now_available >= wanted:
        return 0
    deficit = wanted - now_available
    raw = deficit / rate * 1000.0
    guess = _clamp_wait(math.ceil(raw) if math.isfinite(raw) else raw)
    if 1 <= guess < MAX_EXACT:
        # The usual answer, without the loops below (this runs on every local
        # take): ready at the guess and not a ms before. `_available` inline,
        # operation for operation.
        floor = -_MAX_EXACT_F if tokens < -_MAX_EXACT_F else tokens
        elapsed = (now + guess) - last
        if elapsed < 0.0:
            elapsed = 0.0
        refilled = floor + elapsed / 1000.0 * rate
        if (capacity if refilled > capacity else refilled) >= wanted:
            if guess == 1:
                return 1
            elapsed = (now + (guess - 1)) - last
            if elapsed < 0.0:
                elapsed = 0.0
            refilled = floor + elapsed / 1000.0 * rate
            if (capacity if refilled > capacity else refilled) < wanted:
                return guess
    step = 1
    if available(tokens, last, capacity, rate, now + guess) >= wanted:
        is_ready = guess
        while True:
            probe = is_ready - step
            if probe <= 0:
                not_ready = 0
                break
            if available(tokens, last, capacity, rate, now + probe) < wanted:
                not_ready = probe
                break
            is_ready = probe
            step *= 2
    else:
        not_ready = guess
        while True:
            probe = not_ready + step
            if probe >= MAX_EXACT:
                is_ready = MAX_EXACT
                break
            if available(tokens, last, capacity, rate, now + probe) >= wanted:
                is_ready = probe
                break
            not_ready = probe
            step *= 2
    while is_ready - not_ready > 1:
        mid = not_ready + (is_ready - not_ready) // 2
        if available(tokens, last, capacity, rate, now + mid) >= wanted:
            is_ready = mid
        else:
            not_ready = mid
    return is_ready


def _remaining(tokens: float) -> int:
    return math.floor(tokens) if tokens > 0.0 else 0


def take(state: Optional[Tuple[float, float]], capacity: float, rate: float, n: float, now_ms: int):
    """bucket.rs `take` on a stored (tokens, last_refill_ms) or None (a
    full bucket): (allowed, remaining, retry_after_ms, reset_after_ms, write)."""
    now = float(now_ms)
    repair = None
    if state is None:
        tokens, last = capacity, now
    else:
        tokens, last = state
        if last > now:  # the clock stepped back: the gap is no refill
            last = now
            repair = (_available(tokens, now, capacity, rate, now), now)
    # `_available(tokens, last, capacity, rate, now)`, inline (every local take runs it).
    elapsed = now - last
    if elapsed < 0.0:
        elapsed = 0.0
    refilled = (-_MAX_EXACT_F if tokens < -_MAX_EXACT_F else tokens) + elapsed / 1000.0 * rate
    available = capacity if refilled > capacity else refilled
    if available < n:
        retry = -1 if n > capacity else first_ms_when(tokens, last, capacity, rate, now, n)
        reset = first_ms_when(tokens, last, capacity, rate, now, capacity)
        return False, _remaining(available), retry, reset, repair
    left = available - n
    remaining = _floor(left) if left > 0.0 else 0
    if n > 0.0:
        return True, remaining, 0, _full_after(left, capacity, rate, now), (left, now)
    t, l = repair if repair is not None else (tokens, last)
    return True, remaining, 0, first_ms_when(t, l, capacity, rate, now, capacity), repair


def _full_after(left: float, capacity: float, rate: float, now: float) -> int:
    """`first_ms_when(left, now, capacity, rate, now, capacity)` of a bucket
    just written with `left` tokens at `now` (every allowed local take):
    what it holds now is `left` itself, so the first test and the guess
    need no `_available`; the guess is checked as first_ms_when checks it,
    and anything else is left to first_ms_when."""
    deficit = capacity - left
    if deficit <= 0.0:
        return 0
    raw = deficit / rate * 1000.0
    if raw < _MAX_EXACT_F:
        guess = _ceil(raw)
        if guess < MAX_EXACT and left + ((now + guess) - now) / 1000.0 * rate >= capacity:
            if guess == 1 or left + ((now + (guess - 1)) - now) / 1000.0 * rate < capacity:
                return guess
    return first_ms_when(left, now, capacity, rate, now, capacity)


def take_all(states, limits, now_ms: int):
    """bucket.rs `take_all` over `limits` [(capacity, rate, n)] with their
    `states`: all or nothing. (allowed, decisive index, outcomes)."""
    outcomes = [take(s, c, r, n, now_ms) for s, (c, r, n) in zip(states, limits)]
    allowed = all(o[0] for o in outcomes)
    if not allowed:
        # Nothing is taken: a bucket that would have allowed is answered as a look.
        outcomes = [take(s, c, r, 0.0, now_ms) if o[0] else o for o, s, (c, r, n) in zip(outcomes, states, limits)]

    def weight(o):
        if allowed:
            return (o[2], -o[1])
        return (math.inf, 0) if o[2] < 0 else (o[2], 0)  # -1, never, is the longest

    decisive, heaviest = 0, None
    for i, o in enumerate(outcomes):
        w = weight(o)
        if heaviest is None or w > heaviest:
            decisive, heaviest = i, w
    return allowed, decisive, outcomes


class LRU(OrderedDict):
    """At most `max_keys` entries; the least recently used goes first."""

    def __init__(self, max_keys: int):
        super().__init__()
        self.max_keys = max_keys

    def touch(self, key, value):
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.max_keys:
            self.popitem(last=False)


class LocalLimiter:
    """Each key's bucket in process at 1/instances of its limit."""

    def __init__(self, instances: int, max_keys: int):
        self.instances = instances
        self.buckets = LRU(max_keys)

    def decide(self, call: Call, now_ms: int) -> Decision:
        """The local answer to a take, peek or take_all `call`."""
        buckets, k = self.buckets, self.instances
        if call.op != "takeall":  # the usual call, without take_all's lists
            key = call.keys[0]
            policy, capacity, rate = call.limits[0]
            o = take(buckets.get(key), capacity / k, rate / k, call.amounts[0], now_ms)
            if call.op == "take" and o[4] is not None:
                buckets.touch(key, o[4])
            elif key in buckets:
                buckets.move_to_end(key)
            return quick_decision(o[0], o[1], o[2], o[3], None, capacity, rate, policy, (), "local")
        limits = [(cap / k, rate / k, n) for (_, cap, rate), n in zip(call.limits, call.amounts)]
        allowed, index, outcomes = take_all([buckets.get(key) for key in call.keys], limits, now_ms)
        for key, o in zip(call.keys, outcomes):
            if o[4] is not None:
                buckets.touch(key, o[4])
            elif key in buckets:
                buckets.move_to_end(key)
        o = outcomes[index]
        policy, capacity, rate = call.limits[index]
        return quick_decision(allowed, o[1], o[2], o[3], index, capacity, rate, policy, call.limits, "local")

    def clear(self):
        self.buckets.clear()


def primed_denial_ms(remaining: int, n: float, capacity: float, rate: float, reset_after_ms: int) -> int:
    """After an allowed take of `n` that left `remaining` < n whole tokens:
    how long the same take stays denied, from the reply alone. The bucket
    is full after reset_after_ms and holds n (capacity - n) / rate seconds
    before that, so w = reset_after_ms - ceil((capacity - n) * 1000 / rate),
    and the answer is w + 1 ms: the server's tokens are doubles and both
    terms are rounded up, so the n-th token can come back a ms after w, and
    a take sent then is one more denied call per window (docs/clients.md,
    the same rule in every library). 0 (nothing to remember) when the take
    left n, the bucket does not refill, the reply has no reset time or
    w <= 0 (core/src/denial_cache.rs; clients/conformance/vectors/denial_cache.json),
    a rate so slow that the second term overflows included."""
    if remaining >= n or not rate > 0 or reset_after_ms < 0:
        return 0
    from_n_to_full = (capacity - n) * 1000 / rate
    if from_n_to_full == math.inf:
        return 0
    w = reset_after_ms - math.ceil(from_n_to_full)
    return w + 1 if w > 0 else 0


class DenialCache:
    """Denials remembered until the time they name, per key: [until_ms, n,
    remaining, reset_after_ms, at_ms, call, answered_ms, decision]. Only
    takes of at least n tokens without a reservation are answered from it.
    The last three are its last answer: the same call in the same ms (a
    flood) gets that very Decision back (immutable), built once."""

    def __init__(self, max_keys: int):
        self.entries = LRU(max_keys)

    def answer(self, call: Call, now_ms: int) -> Optional[Decision]:
        entries = self.entries
        if not entries or "MAXWAIT" in call.options:
            return None
        for index, key in enumerate(call.keys):
            entry = entries.get(key)
            if entry is None:
                continue
            until = entry[0]
            if now_ms >= until:
                del entries[key]
                continue
            if entry[5] is call:  # the call this entry answered last (so n is enough)
                entries.move_to_end(key)
                if entry[6] == now_ms:
                    return entry[7]
            elif call.amounts[index] < entry[1]:
                continue
            else:
                entries.move_to_end(key)
            policy, capacity, rate = call.limits[index]
            takeall = call.op == "takeall"
            d = quick_decision(False, entry[2], until - now_ms, max(0, entry[3] - (now_ms - entry[4])),
                               index if takeall else None, capacity, rate, policy,
                               call.limits if takeall else (), "cache")
            entry[5], entry[6], entry[7] = call, now_ms, d
            return d
        return None

    def remember(self, call: Call, d: Decision, now_ms: int):
        """Keep the server's denial `d` of `call` until its retry time; and
        an allowed take that left fewer than n tokens as the denial the
        next one would get, until the bucket holds n again
        (`primed_denial_ms`): so a flood by one id reaches the server once
        per retry window, not twice."""
        if d.allowed:
            # Only a plain take: a reservation may go into debt, and under a
            # lockout the next take's denial would lock the key, which only
            # the server does.
            if call.op != "take" or call.options:
                return
            n = call.amounts[0]
            wait = primed_denial_ms(d.remaining, n, float(d.capacity), float(d.rate), d.reset_after_ms)
            index = 0
        else:
            if "MAXWAIT" in call.options:
                return
            index = d.index or 0
            n = call.amounts[index]
            wait = d.retry_after_ms
        if wait <= 0:
            return
        self.entries.touch(call.keys[index], [now_ms + wait, n, d.remaining, d.reset_after_ms, now_ms, None, -1, None])

    def forget(self, key: str):
        self.entries.pop(key, None)


class Outage:
    """Whether Redis is taken to be down, and when to try it again: during
    an outage nothing is sent for `probe_ms`, then one call probes Redis
    (docs/clients.md#when-redis-is-down-the-local-limiter). The times are
    whole ms, passed in; the caller holds the lock (`Shield`'s)."""

    def __init__(self, probe_ms: int, instances: int):
        self.probe_ms = probe_ms
        self.instances = instances
        self.active = False
        self.probe_at_ms = 0
        self.reason = ""  # the error that started it

    def should_send(self, now_ms: int) -> bool:
        """Whether a call at `now_ms` goes to Redis (in an outage: it
        becomes the probe, and the next one is `probe_ms` later)."""
        if not self.active:
            return True
        if now_ms < self.probe_at_ms:
            return False
        self.probe_at_ms = now_ms + self.probe_ms
        return True

    def failed(self, reason: str, now_ms: int) -> bool:
        """A call found Redis unreachable: nothing is sent for another
        `probe_ms`. True when this starts the outage (log it)."""
        self.probe_at_ms = now_ms + self.probe_ms
        if self.active:
            return False
        self.active, self.reason = True, reason
        return True

    def succeeded(self) -> bool:
        """A call reached Redis. True when this ends the outage (log it)."""
        ended, self.active = self.active, False
        return ended

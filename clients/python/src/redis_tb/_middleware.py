"""What the ASGI and WSGI middleware share: limits, keys, responses, outages."""

from __future__ import annotations

import json
import logging
import threading
from typing import Callable, List, Optional, Sequence, Tuple, Union

from ._core import Decision, Limit, Number, Policy

log = logging.getLogger("redis_tb")

PROBLEM_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def policies(spec: Union[Policy, Sequence[Policy]]) -> List[Policy]:
    """One Policy (name default "default") or several (default "limit<i>")."""
    if isinstance(spec, Policy):
        return [spec if spec.name else Policy(spec.capacity, spec.rate, "default")]
    items = list(spec)
    if not items or not all(isinstance(p, Policy) for p in items):
        raise TypeError("policies must be a Policy or a non-empty list of Policy")
    if len(items) == 1:
        return policies(items[0])
    named = [p if p.name else Policy(p.capacity, p.rate, f"limit{i}") for i, p in enumerate(items)]
    if len({p.name for p in named}) != len(named):
        raise ValueError("policy names must be distinct")
    return named


def bucket_key(prefix: str, identity: str, name: str) -> str:
    """`<prefix>{<identity>}:<name>`: the hash tag keeps one caller's
    buckets in one cluster slot, so several policies can be taken at once."""
    return f"{prefix}{{{identity or '-'}}}:{name}"


def limits_for(prefix: str, identity: str, pols: List[Policy], n: Number) -> List[Limit]:
    return [Limit(bucket_key(prefix, identity, p.name), p.capacity, p.rate, n, p.name) for p in pols]


def header_list(d: Decision) -> List[Tuple[str, str]]:
    return list(d.headers().items())


def denied_body(d: Decision) -> bytes:
    if d.retry_after_ms < 0:
        detail = f'This request costs more than policy "{d.name}" can ever allow.'
    else:
        secs = -(-d.retry_after_ms // 1000)
        detail = f'Rate limit of policy "{d.name}" exceeded; retry in {secs} s.'
    return json.dumps(
        {
            "type": PROBLEM_TYPE,
            "title": "Too Many Requests",
            "status": 429,
            "detail": detail,
            "violated-policies": [d.name],
        }
    ).encode()


def unavailable_body() -> bytes:
    return json.dumps(
        {
            "title": "Service Unavailable",
            "status": 503,
            "detail": "The rate limiter is unavailable.",
        }
    ).encode()


PROBLEM_JSON = "application/problem+json"


class Outage:
    """Logs once when limiter calls start failing and once when they work
    again, however many requests pass in between."""

    def __init__(self, fail_open: bool):
        self.fail_open = fail_open
        self.down = False
        self._lock = threading.Lock()

    def failed(self, error: Exception):
        with self._lock:
            if self.down:
                return
            self.down = True
        action = "letting requests through" if self.fail_open else "answering 503"
        log.warning("redis-tb: rate limiter unavailable, %s: %s", action, error)

    def ok(self):
        if not self.down:
            return
        with self._lock:
            if not self.down:
                return
            self.down = False
        log.info("redis-tb: rate limiter available again")


KeyFunc = Callable[..., str]
CostFunc = Optional[Callable[..., Number]]

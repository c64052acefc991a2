"""What the ASGI and WSGI middleware share: limits, keys, responses, outages."""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from typing import Callable, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

from . import _metrics
from ._core import (Concurrency, Decision, InvalidArgument, Lease, Limit, LimiterError, LimiterUnavailable, Number,
                    Policy, bucket_key, concurrency_item, number_text, policy_item)

log = logging.getLogger("redis_tb")

PROBLEM_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def named_policies(spec: Union[Policy, Sequence[Policy], None], concurrency: Optional[Concurrency] = None) -> List[Policy]:
    """One Policy (name default "default") or several (default "limit<i>");
    None (no rate limit) only with a Concurrency, whose name must differ."""
    if concurrency is not None:
        if not isinstance(concurrency, Concurrency):
            raise InvalidArgument(f"concurrency must be a Concurrency, not {type(concurrency).__name__}")
        named = [] if spec is None else named_policies(spec)
        if concurrency.name in {p.name for p in named}:
            raise InvalidArgument(f"the Concurrency and a Policy are both named {concurrency.name!r}")
        return named
    if isinstance(spec, Policy):
        return [spec if spec.name else Policy(spec.capacity, spec.rate, "default")]
    items = list(spec) if isinstance(spec, (list, tuple)) else []
    if not items or not all(isinstance(p, Policy) for p in items):
        raise InvalidArgument("policies must be a Policy or a non-empty list of Policy")
    if len(items) == 1:
        return named_policies(items[0])
    named = [p if p.name else Policy(p.capacity, p.rate, f"limit{i}") for i, p in enumerate(items)]
    if len({p.name for p in named}) != len(named):
        raise InvalidArgument("policy names must be distinct")
    return named


def peer_id(remote: Optional[str]) -> str:
    """The default key of a peer address: an IPv4-mapped IPv6 address
    (``::ffff:127.0.0.1``, what a dual-stack socket reports) as the IPv4
    address, so one client has one bucket whichever language serves it
    (docs/clients.md#the-same-behaviour-in-all-three); ``unknown`` for none."""
    if not remote:
        return "unknown"
    if remote[:7].lower() == "::ffff:":
        try:
            return str(ipaddress.IPv4Address(remote[7:]))
        except ValueError:
            pass
    return remote


def on_unavailable_mode(on_unavailable: Optional[str], fail_open: Optional[bool], limiter) -> str:
    """The middleware's `on_unavailable` ("open", "closed" or "local"),
    from it or from the older `fail_open` (True: open, False: closed). Local
    is the limiter's local limiter: it needs one."""
    if on_unavailable is None:
        return "closed" if fail_open is False else "open"
    if on_unavailable not in ("open", "closed", "local"):
        raise InvalidArgument(f"on_unavailable must be 'open', 'closed' or 'local', not {on_unavailable!r}")
    if fail_open is not None and (on_unavailable == "closed") == bool(fail_open):
        raise InvalidArgument(f"fail_open={fail_open!r} contradicts on_unavailable={on_unavailable!r}")
    if on_unavailable == "local" and getattr(limiter, "on_unavailable", None) != "local":
        raise InvalidArgument("on_unavailable='local' needs a limiter made with on_unavailable='local' "
                              "(its instances and local_max_keys)")
    return on_unavailable


def policy_line(policies: Sequence[Policy], concurrency: Optional[Concurrency]) -> str:
    """The one RateLimit-Policy line of a middleware: the rate policies in
    their order, the in-flight limit last."""
    items = [policy_item(p.name, p.capacity, p.rate) for p in policies]
    if concurrency is not None:
        items.append(concurrency_item(concurrency.name, concurrency.limit))
    return ", ".join(items)


def check_cost(cost):
    """None (1 token a request), a fixed number of tokens, checked now, or a
    function of the request (checked on each request: a bad cost is a bug,
    answered 500)."""
    if cost is not None and not callable(cost):
        number_text(cost, "cost", positive=False)
    return cost


def limits_for(prefix: str, identity: str, pols: List[Policy], n: Number) -> List[Limit]:
    """The request's buckets; the id is escaped (bucket_key), so no id can
    move one of its buckets to another cluster slot."""
    return [Limit(bucket_key(prefix, identity, p.name), p.capacity, p.rate, n, p.name) for p in pols]


def header_list(d: Decision) -> List[Tuple[str, str]]:
    return list(d.headers().items())


def merged_headers(*decisions) -> List[Tuple[str, str]]:
    """The headers of a rate Decision and a Lease together: one
    RateLimit-Policy listing both, the rest as each gives them."""
    out = {}
    for d in decisions:
        if d is None:
            continue
        for k, v in d.headers().items():
            out[k] = f"{out[k]}, {v}" if k == "RateLimit-Policy" and k in out else v
    return list(out.items())


def lease_denied_headers(policies: Sequence[Policy], concurrency: Concurrency, d: Lease) -> List[Tuple[str, str]]:
    """A lease denial's headers: no rate token was taken (in-flight comes
    first), but the policy line still names every policy."""
    return [("RateLimit-Policy", policy_line(policies, concurrency))] + [
        (k, v) for k, v in d.headers().items() if k != "RateLimit-Policy"]


def lease_denied_body(d: Lease, status: int) -> bytes:
    secs = max(1, -(-d.retry_after_ms // 1000))
    return json.dumps(
        {
            "type": PROBLEM_TYPE,
            "title": "Too Many Requests" if status == 429 else "Service Unavailable",
            "status": status,
            "detail": f'Concurrency limit of policy "{d.policy}" reached ({d.limit} at once); retry in {secs} s.',
            "violated-policies": [d.policy],
        }
    ).encode()


def release_failed(error: LimiterError):
    """A middleware's release that failed: logged, never raised (the
    response is already on its way; the lease ends at its deadline)."""
    if isinstance(error, LimiterUnavailable):
        log.warning("redis-tb: could not release a request's lease; it ends at its deadline: %s", error)
    else:
        log.error("redis-tb: releasing a request's lease failed (a bug): %s", error)


def denied_body(d: Decision) -> bytes:
    if d.retry_after_ms < 0:
        detail = f'This request costs more than policy "{d.policy}" can ever allow.'
    else:
        secs = -(-d.retry_after_ms // 1000)
        detail = f'Rate limit of policy "{d.policy}" exceeded; retry in {secs} s.'
    return json.dumps(
        {
            "type": PROBLEM_TYPE,
            "title": "Too Many Requests",
            "status": 429,
            "detail": detail,
            "violated-policies": [d.policy],
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


def error_body() -> bytes:
    return json.dumps(
        {
            "title": "Internal Server Error",
            "status": 500,
            "detail": "The rate limiter failed (see the server's log).",
        }
    ).encode()


PROBLEM_JSON = "application/problem+json"

# What the middleware does with a request (docs/clients.md#the-failure-rule).
DECIDED = "decided"
FAIL_OPEN = "fail_open"
FAIL_CLOSED = "fail_closed"
ERROR = "error"


class OutageLog:
    """The middleware's failure rule, the same for ASGI and WSGI: an
    unavailable limiter fails open or closed, logged once per outage (one
    WARNING when failures start, one INFO when calls work again) and
    counted; any other limiter error is a bug, logged at ERROR every time
    and never let through. (The middleware's `outcomes`, the name its
    README gives the counts; `OutageLog` in all three libraries.)"""

    def __init__(self, fail_open: bool):
        self.fail_open = fail_open
        self.down = False
        self.unavailable_count = 0  # calls that met an unavailable limiter
        self.error_count = 0  # calls that met a bug
        self._lock = threading.Lock()

    def failed(self, error: LimiterError) -> str:
        if not isinstance(error, LimiterUnavailable):
            with self._lock:
                self.error_count += 1
            log.error("redis-tb: rate limiter error (a bug of the configuration or the data): %s", error)
            return ERROR
        with self._lock:
            self.unavailable_count += 1
            was_down, self.down = self.down, True
        if not was_down:
            action = "letting requests through" if self.fail_open else "answering 503"
            log.warning("redis-tb: rate limiter unavailable, %s: %s", action, error)
        return FAIL_OPEN if self.fail_open else FAIL_CLOSED

    def succeeded(self):
        if not self.down:
            return
        with self._lock:
            if not self.down:
                return
            self.down = False
        log.info("redis-tb: rate limiter available again")


KeyFunc = Callable[..., str]
CostFunc = Optional[Callable[..., Number]]

L = TypeVar("L")  # the limiter: RateLimiter (WSGI) or AsyncRateLimiter (ASGI)


class Middleware(Generic[L]):
    """The options of both middleware classes, checked when it is created,
    so that ASGI and WSGI take the same ones (their docstrings: asgi.py).
    Only the request handling, sync or async, is each one's own."""

    # The key when none is given: the protocol's client_ip, a staticmethod
    # (the two read the peer address from different places).
    default_key: KeyFunc

    def __init__(
        self,
        app,
        limiter: L,
        policies: Union[Policy, Sequence[Policy], None] = None,
        *,
        concurrency: Optional[Concurrency] = None,
        key: Optional[KeyFunc] = None,
        cost=None,
        prefix: str = "ratelimit:",
        on_unavailable: Optional[str] = None,
        fail_open: Optional[bool] = None,
        on_error=None,
    ):
        self.app = app
        self.limiter = limiter
        self.policies = named_policies(policies, concurrency)
        self.concurrency = concurrency
        self.key: KeyFunc = self.default_key if key is None else key
        self.cost = check_cost(cost)
        self.prefix = prefix
        self.on_error = on_error
        self.on_unavailable = on_unavailable_mode(on_unavailable, fail_open, limiter)
        # "local": the limiter answers takes itself while Redis is down; what
        # still fails (a lease) goes through, as with "open".
        self.outcomes = OutageLog(self.on_unavailable != "closed")
        self.metrics = _metrics.of(limiter)

    def unavailable(self, outcome: str, leasing: bool, started: float):
        """Count a request the limiter could not decide, let through
        (FAIL_OPEN) or refused (FAIL_CLOSED): as the in-flight lease it did
        not get (`leasing`: the lease was what failed), and as one decision
        of its rate limits, under the first policy's name (with several
        there is no deciding one; the first is the one the headers name
        first). Its limiter counted nothing: the call raised."""
        metrics = self.metrics
        if not metrics.enabled:
            return
        allowed = outcome == FAIL_OPEN
        source = _metrics.UNAVAILABLE_ALLOWED if allowed else _metrics.UNAVAILABLE_DENIED
        if leasing:
            metrics.lease(self.concurrency.name, _metrics.ACQUIRED if allowed else _metrics.DENIED, source)
        if self.policies:
            metrics.decision(self.policies[0].name, allowed, source, started)

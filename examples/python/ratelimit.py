"""Rate limiting with redis-tb's TB.TAKE from Python (redis-py).

    r = connect("redis://127.0.0.1:6379/0")
    d = take(r, "ratelimit:user:42", capacity=20, rate=5)   # burst 20, 5/s
    if not d.allowed:
        ...  # 429, with d.headers(20, 5)

TB.TAKE replies [allowed, remaining, retry_after_ms, reset_after_ms]; see
`Decision.headers` for the mapping to RateLimit-Policy / RateLimit /
Retry-After (draft-ietf-httpapi-ratelimit-headers-07 shape).

`RateLimitMiddleware` wraps any WSGI app. It fails open: if Redis is
unreachable, slow, or answers an error, the request goes through and a
warning is logged, so a Redis outage does not become an API outage.
Run the demo with `python ratelimit.py` (REDIS_URL, default
redis://127.0.0.1:6379/0) and `curl -i http://127.0.0.1:8000/`.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Callable, Iterable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("ratelimit")


def connect(url: str, timeout: float = 0.25) -> redis.Redis:
    """A client tuned for a rate limiter: short timeouts and a single
    immediate retry (enough to replace a pooled connection that went stale
    across a Redis restart), instead of redis-py's default of retrying with
    back-off, which would make every request slow while Redis is down."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 1),
    )


def _ceil_secs(ms: int) -> int:
    return -(-ms // 1000)


@dataclass(frozen=True)
class Decision:
    """The reply of TB.TAKE, field by field."""

    allowed: bool
    remaining: int  # whole tokens left (or available now, when denied)
    retry_after_ms: int  # 0 if allowed; -1 if it can never succeed (n > capacity)
    reset_after_ms: int  # until the bucket is full again

    @classmethod
    def from_reply(cls, reply) -> "Decision":
        allowed, remaining, retry_after_ms, reset_after_ms = (int(x) for x in reply)
        return cls(allowed == 1, remaining, retry_after_ms, reset_after_ms)

    @property
    def can_never_succeed(self) -> bool:
        return not self.allowed and self.retry_after_ms < 0

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before the same call would be allowed; None when
        allowed, or when waiting can never help."""
        if self.allowed or self.retry_after_ms <= 0:
            return None
        return self.retry_after_ms / 1000

    def headers(self, capacity: float, rate: float) -> list[tuple[str, str]]:
        """Response headers for a bucket of `capacity` refilled at `rate`/s.

        RateLimit-Policy: <floor(capacity)>;w=<ceil(capacity / rate)>
        RateLimit: limit=<floor(capacity)>, remaining=<remaining>, reset=<ceil(reset_after_ms / 1000)>
        Retry-After: <ceil(retry_after_ms / 1000)>   only when denied and a wait can help
        """
        limit = math.floor(capacity)
        window = max(1, math.ceil(capacity / rate))
        headers = [
            ("RateLimit-Policy", f"{limit};w={window}"),
            (
                "RateLimit",
                f"limit={limit}, remaining={self.remaining}, "
                f"reset={_ceil_secs(self.reset_after_ms)}",
            ),
        ]
        if self.retry_after is not None:
            headers.append(("Retry-After", str(max(1, _ceil_secs(self.retry_after_ms)))))
        return headers


def take(r: redis.Redis, key: str, capacity: float, rate: float, n: float = 1) -> Decision:
    """Take `n` tokens from the bucket at `key` (burst `capacity`, refilled at
    `rate` tokens per second). Raises redis.RedisError on connection problems
    and on argument errors (for example 'rate must be a positive finite number')."""
    return Decision.from_reply(r.execute_command("TB.TAKE", key, capacity, rate, n))


def client_ip(environ) -> str:
    return "ratelimit:" + environ.get("REMOTE_ADDR", "unknown")


class RateLimitMiddleware:
    """WSGI middleware: one token per request from the bucket `key(environ)`."""

    def __init__(
        self,
        app,
        r: redis.Redis,
        capacity: float,
        rate: float,
        cost: float = 1,
        key: Callable[[dict], str] = client_ip,
    ):
        self.app, self.redis = app, r
        self.capacity, self.rate, self.cost, self.key = capacity, rate, cost, key

    def __call__(self, environ, start_response) -> Iterable[bytes]:
        try:
            d = take(self.redis, self.key(environ), self.capacity, self.rate, self.cost)
        except redis.RedisError as e:
            # Fail open: the limiter protects the API, it must not take it down.
            log.warning("rate limiter unavailable, failing open: %s", e)
            return self.app(environ, start_response)

        headers = d.headers(self.capacity, self.rate)
        if not d.allowed:
            start_response(
                "429 Too Many Requests",
                headers + [("Content-Type", "text/plain; charset=utf-8")],
            )
            return [b"rate limit exceeded\n"]

        def start_with_headers(status, response_headers, exc_info=None):
            return start_response(status, list(response_headers) + headers, exc_info)

        return self.app(environ, start_with_headers)


def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
    return [b"hello\n"]


def make_app(r: redis.Redis, capacity: float = 5, rate: float = 1):
    """The demo: `hello`, 5 requests of burst per client IP, then 1 per second."""
    return RateLimitMiddleware(hello, r, capacity, rate)


if __name__ == "__main__":
    from wsgiref.simple_server import make_server

    logging.basicConfig(level=logging.INFO)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    with make_server("127.0.0.1", 8000, make_app(connect(url))) as httpd:
        log.info("listening on http://127.0.0.1:8000/ (Redis at %s)", url)
        httpd.serve_forever()

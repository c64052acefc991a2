"""Micro-benchmark for `make bench`: what the local limiter and the denial
cache cost against one Redis round trip, through this library.

    python clients/python/bench/local_bench.py --port P

P: a running server with the module on 127.0.0.1. Prints one line of JSON:
{"library": "python", "get_round_trip_us": x, "local_take_us": y, "cached_denial_us": z}
(microseconds per call, the median of several batches).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time

import redis

from redis_tb import LimiterUnavailable, RateLimiter

BATCHES = 15


def per_call_us(fn, calls: int) -> float:
    """The median over BATCHES of the mean time of one call in a batch."""
    fn()  # warm up
    batches = []
    for _ in range(BATCHES):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        batches.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(batches)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port

    client = redis.Redis(port=port)
    client.set("bench:get", "x")
    get_us = per_call_us(lambda: client.get("bench:get"), 2_000)

    # (b) Redis unreachable: the first take starts the outage, the rest are local.
    down = RateLimiter(redis.Redis(port=closed_port()), on_unavailable="local", local_probe_ms=3_600_000)
    assert down.take("bench:local", 1e9, 1e9).source == "local"
    local_us = per_call_us(lambda: down.take("bench:local", 1e9, 1e9), 20_000)

    # (c) An emptied bucket, then takes on it: answered by the denial cache.
    cached = RateLimiter(redis.Redis(port=port), cache_denials=True)
    client.delete("bench:cached")
    while cached.take("bench:cached", 10, 0.001).allowed:
        pass
    assert cached.take("bench:cached", 10, 0.001).source == "cache"
    cached_us = per_call_us(lambda: cached.take("bench:cached", 10, 0.001), 20_000)

    for lim in (down, cached):
        lim.close()
    client.close()
    print(json.dumps({"library": "python", "get_round_trip_us": round(get_us, 3),
                      "local_take_us": round(local_us, 3), "cached_denial_us": round(cached_us, 3)}))


if __name__ == "__main__":
    try:
        main()
    except LimiterUnavailable as e:
        raise SystemExit(f"local_bench: {e}")

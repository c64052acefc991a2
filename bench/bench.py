#!/usr/bin/env python3
"""`make bench`: TB.TAKE against the Lua token bucket it replaces, in one run.

Starts its own servers on free loopback ports (a plain one, a master with a
replica, and one with AOF on), each with the release module loaded, and
measures:

* server-side cost per call (INFO commandstats, CONFIG RESETSTAT before each
  row) and end-to-end throughput (redis-benchmark, pipelined) for PING, INCR,
  a 2-field HSET, the Lua script via EVALSHA, TB.TAKE and the peer module
  redis-cell's CL.THROTTLE (when scripts/build-redis-cell.sh could build it;
  loaded beside the module), on random keys and on one hot key, allowed and
  denied paths apart, without and with AOF;
* TB.TAKEALL over 2,000 and 20,000 keys in one call next to MSET of as many
  keys (how the per-call cost scales with the number of keys);
* memory per bucket (used_memory delta over many buckets, MEMORY USAGE);
* replication bytes per call (master_repl_offset growth with a replica).

Rows are interleaved (every row once, then every row again, ...) so slow
phases of a noisy machine hit all rows alike, and every ratio is computed
within one repetition, then summarised by its median.

Python 3.11 standard library only. Results go to bench/results/results.json,
bench/results/results.md and bench/results/chart.svg.
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# The client, the servers and the tables every bench script shares.
from harness import ROOT, BENCH_DIR, RESULTS_DIR, Conn, ReplyError, Server, commandstats, md_table, stop_all, text_table
from harness import git_rev as harness_git_rev

LUA_PATH = BENCH_DIR / "reference_token_bucket.lua"

# redis-benchmark expands __rand_int__ to a 12-digit, zero-padded number below
# -r; the Python-driven parts use the same key names.
KEYSPACE = 100_000
PIPELINE = 32
CLIENTS = 8
HOT_KEY = "key:hot"
RAND_KEY = "key:__rand_int__"

# Bucket parameters. Allowed: a huge capacity that a run never drains, and a
# slow refill so each bucket keeps a TTL (a bucket that is full again expires)
# and its tokens become fractional. Denied: capacity 1 drained beforehand and a
# refill so slow that no call in the run is allowed.
ALLOW = ("1000000000", "0.001", "1")
DENY = ("1", "0.000001", "1")
# A fixed client clock for the seed's own calling convention (ARGV[4]).
CLIENT_NOW = "1700000000000"

# The peer: redis-cell's CL.THROTTLE key max_burst count_per_period period
# [quantity] (GCRA; capacity = max_burst + 1, rate = count/period per second,
# integers only). The same buckets as ALLOW and DENY as far as its integer
# arguments and its nanosecond arithmetic allow: the allowed rows refill at
# 0.001/s like ALLOW (1 per 1000 s, so a bucket's TTL is ~1000 s after one
# call, as with TB.TAKE) with a burst of 10^6, not 10^9: redis-cell computes
# period_ns * (max_burst + 1) in an i64, which overflows past ~9.2 * 10^18 ns
# (10^6 * 10^12 ns fits). No row makes 10^6 calls on one key, so no allowed
# row is ever denied. Denied: capacity 1 (max_burst 0) refilling at 10^-6/s,
# drained beforehand with the same command.
CL_ALLOW = ("999999", "1", "1000", "1")
CL_DENY = ("0", "1", "1000000", "1")

# Requests per redis-benchmark run, per command family, at --scale 1: sized so
# each run lasts a few seconds on a small machine (Lua is ~10x slower than
# PING) and the whole bench stays under ~10 minutes.
BASE_N = {"ping": 1_000_000, "incr": 600_000, "hset": 400_000, "tb": 300_000, "lua": 100_000}


def is_allowed(reply) -> bool:
    """TB.TAKE replies [1, ...] when allowed, CL.THROTTLE [0, ...] (its first
    element is "limited"); the Lua script replies like TB.TAKE."""
    return reply[0] == 1


def cl_allowed(reply) -> bool:
    return reply[0] == 0


# --------------------------------------------------------------------------
# Helpers


def rand_key(i: int) -> str:
    return "key:%012d" % i


def median(xs):
    return statistics.median(xs) if xs else None


def summary(xs) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "spread_pct": None, "values": []}
    med = statistics.median(xs)
    spread = (max(xs) - min(xs)) / med * 100 if med else 0.0
    return {"median": med, "min": min(xs), "max": max(xs), "spread_pct": spread, "values": xs}


def wait_aof_rewrite(c: Conn):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = c.info("persistence")
        if info.get("aof_rewrite_in_progress") == "0" and info.get("aof_rewrite_scheduled") == "0":
            return
        time.sleep(0.05)


def fresh_db(c: Conn, aof: bool):
    c.call("FLUSHALL")
    if aof:
        # Start each row from a tiny AOF (a rewrite of the empty dataset drops
        # the old increments), so the disk never fills and no automatic
        # rewrite fires mid-row.
        wait_aof_rewrite(c)
        c.call("BGREWRITEAOF")
        wait_aof_rewrite(c)


def run_redis_benchmark(port: int, args: list[str], n: int) -> float:
    argv = [
        "redis-benchmark", "-h", "127.0.0.1", "-p", str(port),
        "-c", str(CLIENTS), "-P", str(PIPELINE), "-n", str(n),
        "-r", str(KEYSPACE), "--csv", *args,
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"redis-benchmark failed: {out.stderr or out.stdout}")
    for line in out.stdout.splitlines():
        cells = [x.strip('"') for x in line.split('","')]
        if len(cells) >= 2 and cells[0] != "test":
            return float(cells[1])
    raise RuntimeError(f"no result in redis-benchmark output: {out.stdout!r}")


# --------------------------------------------------------------------------
# The cost / throughput rows


@dataclass
class Row:
    impl: str  # PING, INCR, HSET, Lua (TIME), Lua (client now), TB.TAKE
    keys: str  # random | hot | -
    path: str  # allowed | denied | -
    family: str  # key of BASE_N
    stat: str  # commandstats entry
    args: Callable[[str], list[str]]  # key -> command argv (for redis-benchmark)
    drain: bool = False  # drain the buckets before the run (denied rows)
    result: dict = field(default_factory=dict)
    allowed: Callable[[list], bool] = is_allowed  # reply -> was the call allowed
    drain_cmd: Callable[[str], list[str]] = lambda k: ["TB.TAKE", k, *DENY]  # noqa: E731

    @property
    def name(self) -> str:
        return " / ".join(x for x in (self.impl, self.keys, self.path) if x != "-")

    def key(self) -> str:
        return RAND_KEY if self.keys == "random" else HOT_KEY

    def concrete(self, key: str) -> list[str]:
        return self.args(key)


def make_rows(sha: str, peer: bool) -> list[Row]:
    rows = [Row("PING", "-", "-", "ping", "ping", lambda k: ["PING"])]
    for keys in ("random", "hot"):
        rows.append(Row("INCR", keys, "-", "incr", "incr", lambda k: ["INCR", k]))
        rows.append(
            Row("HSET", keys, "-", "hset", "hset",
                lambda k: ["HSET", k, "tokens", "1.5", "last_refill", "1700000000000"])
        )  # fmt: skip
    for keys in ("random", "hot"):
        for path, params in (("allowed", ALLOW), ("denied", DENY)):
            drain = path == "denied"
            rows.append(
                Row("Lua (TIME)", keys, path, "lua", "evalsha",
                    lambda k, p=params: ["EVALSHA", sha, "1", k, *p], drain)
            )  # fmt: skip
            if keys == "random":
                rows.append(
                    Row("Lua (client now)", keys, path, "lua", "evalsha",
                        lambda k, p=params: ["EVALSHA", sha, "1", k, *p, CLIENT_NOW], drain)
                )  # fmt: skip
            rows.append(
                Row("TB.TAKE", keys, path, "tb", "tb.take",
                    lambda k, p=params: ["TB.TAKE", k, *p], drain)
            )  # fmt: skip
            # TB.THROTTLE: redis-cell's arguments and reply on the module's bucket.
            cl = CL_ALLOW if path == "allowed" else CL_DENY
            rows.append(
                Row("TB.THROTTLE", keys, path, "tb", "tb.throttle",
                    lambda k, p=cl: ["TB.THROTTLE", k, *p], drain,
                    allowed=cl_allowed, drain_cmd=lambda k: ["TB.THROTTLE", k, *CL_DENY])
            )  # fmt: skip
            if peer:
                rows.append(
                    Row("CL.THROTTLE", keys, path, "tb", "cl.throttle",
                        lambda k, p=cl: ["CL.THROTTLE", k, *p], drain,
                        allowed=cl_allowed, drain_cmd=lambda k: ["CL.THROTTLE", k, *CL_DENY])
                )  # fmt: skip
    # Several limits per request, all or nothing (random keys, allowed path).
    for buckets in (2, 3):
        rows.append(
            Row(f"TB.TAKEALL x{buckets}", "random", "allowed", "tb", "tb.takeall",
                lambda k, b=buckets: ["TB.TAKEALL", *[x for i in range(b) for x in (f"{k}:{i}", *ALLOW)]])
        )  # fmt: skip
    return rows


def keys_of(row: Row) -> list[str]:
    return [rand_key(i) for i in range(KEYSPACE)] if row.keys == "random" else [HOT_KEY]


def probe_allowed(c: Conn, row: Row) -> float | None:
    """Share of allowed replies among a few calls like the row's (before its run)."""
    if row.path == "-":
        return None
    keys = [rand_key(random.randrange(KEYSPACE)) for _ in range(50)] if row.keys == "random" else [HOT_KEY] * 50
    replies = c.pipeline([row.concrete(k) for k in keys])
    return sum(1 for r in replies if row.allowed(r)) / len(replies)


def run_row(server: Server, c: Conn, row: Row, n: int, aof: bool) -> dict:
    fresh_db(c, aof)
    if row.drain:
        # TB.TAKE drains the buckets for every denied row (the Lua script
        # reads the same layout, and this is 10x faster than draining with
        # it). Its last_refill is the real clock, later than CLIENT_NOW, so
        # the client-now variant sees no elapsed time either. CL.THROTTLE
        # keeps its own format and drains its own buckets.
        c.pipeline([row.drain_cmd(k) for k in keys_of(row)])
    elif row.keys != "-":
        # Every key exists before the timed run, written by the row's own
        # command: each row then measures the steady state (a limiter mostly
        # sees buckets it already has) over the same population of keys,
        # whatever its request count. Without this, a row with more
        # requests would measure more updates and fewer creations.
        c.pipeline([row.concrete(k) for k in keys_of(row)])
    allowed = probe_allowed(c, row)
    c.call("CONFIG", "RESETSTAT")
    started = time.monotonic()
    rps = run_redis_benchmark(server.port, row.concrete(row.key()), n)
    elapsed = time.monotonic() - started
    stats = commandstats(c).get(row.stat)
    if not stats or stats["calls"] < n:
        raise RuntimeError(f"{row.name}: commandstats show {stats} for {n} requests")
    if stats.get("failed_calls", 0) or stats.get("rejected_calls", 0):
        raise RuntimeError(f"{row.name}: failed calls: {stats}")
    return {
        "usec_per_call": stats["usec"] / stats["calls"],
        "rps": rps,
        "allowed_share": allowed,
        "seconds": elapsed,
    }


def bench_rows(servers: dict, rows: list[Row], reps: int, scale: float, log) -> dict:
    """Runs every row on every server, `reps` times, interleaved: row 1 on
    each server, row 2 on each server, ..., then again. Returns, per server
    name, one {row name: result} dict per repetition."""
    per_rep: dict = {name: [] for name in servers}
    conns = {name: server.conn() for name, (server, _) in servers.items()}
    try:
        for rep in range(reps):
            results = {name: {} for name in servers}
            for row in rows:
                n = max(1000, int(BASE_N[row.family] * scale))
                for name, (server, aof) in servers.items():
                    r = run_row(server, conns[name], row, n, aof)
                    r["n"] = n
                    results[name][row.name] = r
                    log(f"  [{name:<5} rep {rep + 1}/{reps}] {row.name:<38} "
                        f"{r['usec_per_call']:7.3f} us/call {r['rps'] / 1000:8.1f} kops/s ({r['seconds']:.1f}s)")  # fmt: skip
            for name in servers:
                per_rep[name].append(results[name])
        for name, (_, aof) in servers.items():
            fresh_db(conns[name], aof)
    finally:
        for c in conns.values():
            c.close()
    return per_rep


# --------------------------------------------------------------------------
# TB.TAKEALL scaling: one call over many keys, next to MSET of as many keys

SCALING_SIZES = (2_000, 20_000)
# TB.TAKEALL does per key what TB.TAKE does (read, refill, write two fields,
# set a TTL, replicate the effects) where MSET stores one string, so its cost
# is a multiple of MSET's; what must hold is that the multiple does not grow
# with the number of keys (MSET's own cost per key grows a little with the
# keyspace: cache misses). Limit on multiple(20k) / multiple(2k):
SCALING_MSET_GROWTH_LIMIT = 1.2
# Calls per command and size at --scale 1 (commandstats averages over them).
# Few TB.TAKEALL calls over 20,000 keys: one whose duplicate-key check is
# quadratic takes over a second there.
SCALING_CALLS = {("TB.TAKEALL", 2_000): 40, ("TB.TAKEALL", 20_000): 10, ("MSET", 2_000): 400, ("MSET", 20_000): 40}


def scaling_names() -> list[str]:
    return [f"{impl} {n} keys" for n in SCALING_SIZES for impl in ("TB.TAKEALL", "MSET")]


def bench_scaling(server: Server, reps: int, scale: float, log) -> dict:
    """Server us/call (commandstats) of one TB.TAKEALL over N distinct keys
    (each `key capacity rate 1` with ALLOW's bucket) and of one MSET of the
    same N keys, for each N in SCALING_SIZES. Every call finds its keys
    already there (one untimed call creates them), as the cost rows do."""
    per_rep = []
    with server.conn() as c:
        for rep in range(reps):
            results = {}
            for n in SCALING_SIZES:
                keys = [rand_key(i) for i in range(n)]
                cmds = {
                    "TB.TAKEALL": ("tb.takeall", ["TB.TAKEALL", *[x for k in keys for x in (k, *ALLOW)]]),
                    "MSET": ("mset", ["MSET", *[x for k in keys for x in (k, "1")]]),
                }
                for impl, (stat, cmd) in cmds.items():
                    name = f"{impl} {n} keys"
                    calls = max(3, int(SCALING_CALLS[(impl, n)] * scale))
                    c.call("FLUSHALL")
                    first = c.call(*cmd)
                    if impl == "TB.TAKEALL" and first[0] != 1:
                        raise RuntimeError(f"{name}: the first call was denied: {first[:3]}")
                    c.call("CONFIG", "RESETSTAT")
                    started = time.monotonic()
                    for _ in range(calls):
                        c.call(*cmd)
                    elapsed = time.monotonic() - started
                    stats = commandstats(c).get(stat)
                    if not stats or stats["calls"] != calls or stats.get("failed_calls", 0):
                        raise RuntimeError(f"{name}: commandstats show {stats} for {calls} calls")
                    usec = stats["usec"] / stats["calls"]
                    results[name] = {
                        "keys": n, "calls": calls, "usec_per_call": usec, "usec_per_key": usec / n,
                        "client_ms_per_call": elapsed / calls * 1000,
                    }  # fmt: skip
                    log(f"  [scaling rep {rep + 1}/{reps}] {name:<22} {usec / 1000:9.2f} ms/call "
                        f"({usec / n:6.3f} us/key, {calls} calls, {elapsed / calls * 1000:8.1f} ms/call at the client)")  # fmt: skip
            per_rep.append(results)
        c.call("FLUSHALL")
    small, big = SCALING_SIZES
    ratios = {
        f"TB.TAKEALL {big} / {small} keys": summary(
            [r[f"TB.TAKEALL {big} keys"]["usec_per_call"] / r[f"TB.TAKEALL {small} keys"]["usec_per_call"] for r in per_rep]),
        f"MSET {big} / {small} keys": summary(
            [r[f"MSET {big} keys"]["usec_per_call"] / r[f"MSET {small} keys"]["usec_per_call"] for r in per_rep]),
    }  # fmt: skip
    for n in SCALING_SIZES:
        ratios[f"TB.TAKEALL / MSET, {n} keys"] = summary(
            [r[f"TB.TAKEALL {n} keys"]["usec_per_call"] / r[f"MSET {n} keys"]["usec_per_call"] for r in per_rep])
    return {"sizes": SCALING_SIZES, "per_rep": per_rep, "ratios": ratios}


def scaling_rows(scaling) -> list[list[str]]:
    out = []
    for name in scaling_names():
        entries = [r[name] for r in scaling["per_rep"]]
        u = summary([e["usec_per_call"] / 1000 for e in entries])
        k = summary([e["usec_per_key"] for e in entries])
        cl = summary([e["client_ms_per_call"] for e in entries])
        out.append([name, str(entries[0]["calls"]), *median_range(u), fmt(k["median"], 3), fmt(cl["median"], 1)])
    for name, r in scaling["ratios"].items():
        out.append([name, "", *median_range(r, unit="x"), "", ""])
    return out


SCALING_HEAD = ["case", "calls", "server ms/call", "range", "us/key", "client ms/call"]


# --------------------------------------------------------------------------
# Memory per bucket

MEM_BUCKETS = 100_000
MEM_PARAMS = ("100", "0.01", "1")  # slow refill: tokens fractional, TTLs long
CL_MEM_PARAMS = ("99", "1", "100", "1")  # the same bucket for CL.THROTTLE


def bench_memory(server: Server, sha: str, reps: int, scale: float, log, peer: bool = False) -> dict:
    count = max(1000, int(MEM_BUCKETS * min(scale, 1.0)))
    impls = {
        "TB.TAKE": lambda k: ["TB.TAKE", k, *MEM_PARAMS],
        "Lua (TIME)": lambda k: ["EVALSHA", sha, "1", k, *MEM_PARAMS],
    }
    if peer:
        impls["CL.THROTTLE"] = lambda k: ["CL.THROTTLE", k, *CL_MEM_PARAMS]
    out = {name: {"delta": [], "usage": [], "sample": None} for name in impls}
    for rep in range(reps):
        for name, cmd in impls.items():
            with server.conn() as c:
                c.call("FLUSHALL")
                time.sleep(0.2)
                before = int(c.info("memory")["used_memory"])
            keys = [f"mem:{i:08d}" for i in range(count)]
            with server.conn() as w:
                w.pipeline([cmd(k) for k in keys])  # creates full-1 buckets
                time.sleep(1.0)
                w.pipeline([cmd(k) for k in keys])  # refill by real elapsed ms: fractional
            time.sleep(0.2)
            with server.conn() as c:
                after = int(c.info("memory")["used_memory"])
                dbsize = c.call("DBSIZE")
                if dbsize != count:
                    raise RuntimeError(f"memory: {name}: {dbsize} keys, expected {count}")
                sample = random.sample(keys, 200)
                usage = c.pipeline([["MEMORY", "USAGE", k, "SAMPLES", "0"] for k in sample])
                if c.call("TYPE", sample[0]) == "hash":
                    fields = c.call("HGETALL", sample[0])
                else:  # CL.THROTTLE: one string, its theoretical arrival time in ns
                    fields = [b"tat_ns", c.call("GET", sample[0])]
                ttl = c.call("PTTL", sample[0])
            out[name]["delta"].append((after - before) / count)
            out[name]["usage"].append(median(usage))
            out[name]["sample"] = {
                "key": sample[0],
                "fields": {fields[i].decode(): fields[i + 1].decode() for i in range(0, len(fields), 2)},
                "pttl_ms": ttl,
            }
            log(f"  [memory rep {rep + 1}/{reps}] {name:<12} used_memory delta "
                f"{out[name]['delta'][-1]:6.1f} B/bucket, MEMORY USAGE {out[name]['usage'][-1]} B")  # fmt: skip
    with server.conn() as c:
        c.call("FLUSHALL")
    return {
        "buckets": count,
        "params": MEM_PARAMS,
        "impls": {
            name: {"delta": summary(v["delta"]), "usage": summary(v["usage"]), "sample": v["sample"]}
            for name, v in out.items()
        },
    }


# --------------------------------------------------------------------------
# Replication bytes per call

REPL_CALLS = 20_000


def wait_replica_online(master: Server, replica: Server):
    deadline = time.monotonic() + 30
    with master.conn() as m, replica.conn() as r:
        while time.monotonic() < deadline:
            if r.info("replication").get("master_link_status") == "up" and "state=online" in m.info(
                "replication"
            ).get("slave0", ""):
                return
            time.sleep(0.1)
    raise RuntimeError("replica did not come online:\n" + replica.log_tail())


def repl_offset(c: Conn) -> int:
    return int(c.info("replication")["master_repl_offset"])


def replica_catch_up(replica: Conn, offset: int):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if repl_offset(replica) >= offset:
            return
        time.sleep(0.05)
    raise RuntimeError(f"the replica did not reach offset {offset}")


def bench_replication(master: Server, replica: Server, sha: str, reps: int, scale: float, log,
                      peer: bool = False) -> dict:  # fmt: skip
    calls = max(1000, int(REPL_CALLS * min(scale, 1.0)))
    cases = [
        ("HSET", "-", lambda k: ["HSET", k, "tokens", "1.5", "last_refill", "1700000000000"], "hset"),
        ("Lua (TIME)", "allowed", lambda k: ["EVALSHA", sha, "1", k, *ALLOW], "evalsha"),
        ("Lua (TIME)", "denied", lambda k: ["EVALSHA", sha, "1", k, *DENY], "evalsha"),
        ("Lua (client now)", "allowed", lambda k: ["EVALSHA", sha, "1", k, *ALLOW, CLIENT_NOW], "evalsha"),
        ("Lua (client now)", "denied", lambda k: ["EVALSHA", sha, "1", k, *DENY, CLIENT_NOW], "evalsha"),
        ("TB.TAKE", "allowed", lambda k: ["TB.TAKE", k, *ALLOW], "tb.take"),
        ("TB.TAKE", "denied", lambda k: ["TB.TAKE", k, *DENY], "tb.take"),
    ]
    if peer:
        cases += [
            ("CL.THROTTLE", "allowed", lambda k: ["CL.THROTTLE", k, *CL_ALLOW], "cl.throttle"),
            ("CL.THROTTLE", "denied", lambda k: ["CL.THROTTLE", k, *CL_DENY], "cl.throttle"),
        ]
    out = {}
    with master.conn() as c, replica.conn() as rc:
        for rep in range(reps):
            for impl, path, cmd, stat in cases:
                name = impl if path == "-" else f"{impl} / {path}"
                c.call("FLUSHALL")
                keys = [rand_key(random.randrange(KEYSPACE)) for _ in range(calls)]
                peer_case = impl == "CL.THROTTLE"
                if path == "denied":
                    drain = (lambda k: ["CL.THROTTLE", k, *CL_DENY]) if peer_case else (lambda k: ["TB.TAKE", k, *DENY])
                    c.pipeline([drain(k) for k in set(keys)])
                c.call("CONFIG", "RESETSTAT")
                before = repl_offset(c)
                replies = c.pipeline([cmd(k) for k in keys])
                after = repl_offset(c)
                stats = commandstats(c)[stat]
                # Does the replica hold what the master holds? (A command
                # that writes keys without propagating anything leaves the
                # replica without them.)
                replica_catch_up(rc, after)
                on_master, on_replica = c.call("DBSIZE"), rc.call("DBSIZE")
                ok = cl_allowed if peer_case else is_allowed
                allowed = None if path == "-" else sum(1 for r in replies if ok(r)) / len(replies)
                entry = out.setdefault(
                    name, {"impl": impl, "path": path, "bytes": [], "usec": [], "allowed_share": [], "replica_keys": []}
                )
                entry["replica_keys"].append(on_replica / on_master if on_master else 1.0)
                entry["bytes"].append((after - before) / calls)
                entry["usec"].append(stats["usec"] / stats["calls"])
                entry["allowed_share"].append(allowed)
                log(f"  [replication rep {rep + 1}/{reps}] {name:<28} {entry['bytes'][-1]:7.1f} B/call "
                    f"(allowed {'-' if allowed is None else f'{allowed:.0%}'}; "
                    f"replica holds {on_replica} of the master's {on_master} keys)")  # fmt: skip
        c.call("FLUSHALL")
    return {
        "calls": calls,
        "cases": {
            name: {
                "impl": e["impl"],
                "path": e["path"],
                "bytes_per_call": summary(e["bytes"]),
                "usec_per_call_with_replica": summary(e["usec"]),
                "allowed_share": median([a for a in e["allowed_share"] if a is not None]),
                "replica_keys_share": min(e["replica_keys"]),
            }
            for name, e in out.items()
        },
    }


# --------------------------------------------------------------------------
# Targets


def ratio_summary(per_rep: list[dict], num: str, den: str, key: str) -> dict:
    values = [rep[num][key] / rep[den][key] for rep in per_rep if num in rep and den in rep]
    return summary(values)


def target(name: str, ratio: dict, limit: float, how: str, *, higher_is_better: bool = False,
           met: bool | None = None, unit: str | None = None) -> dict:  # fmt: skip
    """One row of the targets table: met when the ratio's median is at most
    `limit` (at least, where higher is better), unless `met` is given. The
    keys keep the order results.json has always had them in."""
    if met is None:
        met = ratio["median"] >= limit if higher_is_better else ratio["median"] <= limit
    row = {"target": name, "ratio": ratio, "limit": limit, "met": met}
    if higher_is_better:
        row["higher_is_better"] = True
    if unit is not None:
        row["unit"] = unit
    row["how"] = how
    return row


def evaluate_targets(configs: dict, memory: dict, repl: dict, scaling: dict | None, peer: bool) -> list[dict]:
    targets = []
    tb = "TB.TAKE / random / allowed"
    cl = "CL.THROTTLE / random / allowed"
    luas = ["Lua (TIME) / random / allowed", "Lua (client now) / random / allowed"]
    for cfg_name, per_rep in configs.items():
        suffix = "" if cfg_name == "plain" else f" [{cfg_name}]"
        if peer:
            targets.append(target(f"TB.TAKE no costlier than CL.THROTTLE (redis-cell){suffix}",
                                  ratio_summary(per_rep, tb, cl, "usec_per_call"), 1.0,
                                  "TB.TAKE usec_per_call / CL.THROTTLE usec_per_call, random keys, allowed"))  # fmt: skip
            targets.append(target(f"TB.THROTTLE no costlier than CL.THROTTLE (redis-cell){suffix}",
                                  ratio_summary(per_rep, "TB.THROTTLE / random / allowed", cl, "usec_per_call"), 1.0,
                                  "TB.THROTTLE usec_per_call / CL.THROTTLE usec_per_call, random keys, allowed"))  # fmt: skip
        # Against the cheaper Lua variant of each repetition: the stricter test.
        cost_vs_lua = summary([max(rep[tb]["usec_per_call"] / rep[l]["usec_per_call"] for l in luas) for rep in per_rep])
        targets.append(target(f"TB.TAKE us/call <= 1/4 of Lua's{suffix}", cost_vs_lua, 0.25,
                              "TB.TAKE usec_per_call / the cheaper Lua variant's, random keys, allowed"))  # fmt: skip
        tput = summary([min(rep[tb]["rps"] / rep[l]["rps"] for l in luas) for rep in per_rep])
        targets.append(target(f"TB.TAKE throughput >= 3x Lua's (-P {PIPELINE}){suffix}", tput, 3.0,
                              "TB.TAKE rps / the faster Lua variant's rps, random keys, allowed",
                              higher_is_better=True))  # fmt: skip
    denied = repl["cases"]["TB.TAKE / denied"]["bytes_per_call"]
    lua_denied = repl["cases"]["Lua (TIME) / denied"]["bytes_per_call"]
    others = f"Lua: {lua_denied['median']:.1f} B/call"
    if "CL.THROTTLE / denied" in repl["cases"]:
        others += f", CL.THROTTLE: {repl['cases']['CL.THROTTLE / denied']['bytes_per_call']['median']:.1f} B/call"
    # Every repetition, not the median: one denied byte replicated is a bug.
    targets.append(target("Denied TB.TAKE: 0 replication bytes", denied, 0.0,
                          f"master_repl_offset growth per denied call ({others})",
                          met=denied["max"] == 0.0, unit="B/call"))  # fmt: skip
    tb_mem = memory["impls"]["TB.TAKE"]
    lua_mem = memory["impls"]["Lua (TIME)"]
    mem_ratio = summary([a / b for a, b in zip(tb_mem["delta"]["values"], lua_mem["delta"]["values"])])
    targets.append(target("Memory per bucket <= Lua's (used_memory delta)", mem_ratio, 1.0,
                          f"TB {tb_mem['delta']['median']:.1f} B vs Lua {lua_mem['delta']['median']:.1f} B per bucket"))  # fmt: skip
    usage_ratio = tb_mem["usage"]["median"] / lua_mem["usage"]["median"]
    targets.append(target("MEMORY USAGE of one bucket <= Lua's", summary([usage_ratio]), 1.0,
                          f"TB {tb_mem['usage']['median']:.0f} B vs Lua {lua_mem['usage']['median']:.0f} B"))  # fmt: skip
    if scaling:
        small, big = scaling["sizes"]
        targets.append(target(f"TB.TAKEALL of {big:,} keys costs about {big // small}x {small:,} keys (linear)",
                              scaling["ratios"][f"TB.TAKEALL {big} / {small} keys"], 1.2 * big / small,
                              f"server us/call of TB.TAKEALL over {big} keys / over {small} keys "
                              f"(MSET: {scaling['ratios'][f'MSET {big} / {small} keys']['median']:.2f}x)"))  # fmt: skip
        per_rep = scaling["per_rep"]
        multiple = lambda r, n: r[f"TB.TAKEALL {n} keys"]["usec_per_call"] / r[f"MSET {n} keys"]["usec_per_call"]  # noqa: E731
        growth = summary([multiple(r, big) / multiple(r, small) for r in per_rep])
        m_small = scaling["ratios"][f"TB.TAKEALL / MSET, {small} keys"]["median"]
        m_big = scaling["ratios"][f"TB.TAKEALL / MSET, {big} keys"]["median"]
        targets.append(target(f"TB.TAKEALL stays the same multiple of MSET from {small:,} to {big:,} keys",
                              growth, SCALING_MSET_GROWTH_LIMIT,
                              f"(TB.TAKEALL / MSET at {big} keys) / (the same at {small} keys); "
                              f"the multiples: {m_small:.1f}x at {small}, {m_big:.1f}x at {big}"))  # fmt: skip
    return targets


# --------------------------------------------------------------------------
# The module floor for TB.TAKE: the bench-only build (feature bench-floor,
# src/bucket/floor.rs) has TB.FLOOR.TAKE, which makes TB.TAKE's own
# write (the two fields, the absolute expiry, the effects and notifications)
# without its read or arithmetic. TB.TAKE, the floor and TB.THROTTLE run on
# that build's server, interleaved.

FLOOR_BUILD = ROOT / "target" / "bench-floor" / "release" / "libredis_tb.so"
FAR_DEADLINE = "4102444800000"  # 2100-01-01: the floor's fixed expiry
# What TB.TAKE stores for ALLOW after some refill ("999999997.0006319": 17
# characters): the floor writes text of the same length, so that its listpack
# entry, its AOF and replication bytes are TB.TAKE's, not shorter ones.
FLOOR_TOKENS = "999999997.0006319"
TAKE_FLOOR_LIMIT = 1.15
THROTTLE_OVER_TAKE_LIMIT = 1.03


def floor_rows_spec() -> list[Row]:
    return [
        Row("TB.TAKE", "random", "allowed", "tb", "tb.take", lambda k: ["TB.TAKE", k, *ALLOW]),
        Row("TB.FLOOR.TAKE", "random", "allowed", "tb", "tb.floor.take",
            lambda k: ["TB.FLOOR.TAKE", k, FLOOR_TOKENS, FAR_DEADLINE]),
        Row("TB.THROTTLE", "random", "allowed", "tb", "tb.throttle",
            lambda k: ["TB.THROTTLE", k, *CL_ALLOW], allowed=cl_allowed),
    ]  # fmt: skip


def floor_targets(per_rep: list[dict]) -> list[dict]:
    take, floor, throttle = (r.name for r in floor_rows_spec())
    return [
        target(f"TB.TAKE us/call <= {TAKE_FLOOR_LIMIT}x the module floor (same writes, no read)",
               ratio_summary(per_rep, take, floor, "usec_per_call"), TAKE_FLOOR_LIMIT,
               "TB.TAKE usec_per_call / TB.FLOOR.TAKE usec_per_call, bench-floor build, random keys"),
        target(f"TB.THROTTLE us/call <= TB.TAKE's + {round((THROTTLE_OVER_TAKE_LIMIT - 1) * 100)}%",
               ratio_summary(per_rep, throttle, take, "usec_per_call"), THROTTLE_OVER_TAKE_LIMIT,
               "TB.THROTTLE usec_per_call / TB.TAKE usec_per_call, the same bucket, random keys"),
    ]  # fmt: skip


# --------------------------------------------------------------------------
# The previous build: plain TB.TAKE (no options) must cost what it did before
# the change, measured in the same run: the two modules on two servers,
# rows interleaved.

BASELINE_LIMIT = 1.03


def baseline_rows_spec() -> list[Row]:
    return [Row("TB.TAKE", "random", path, "tb", "tb.take", lambda k, p=params: ["TB.TAKE", k, *p], path == "denied")
            for path, params in (("allowed", ALLOW), ("denied", DENY))]  # fmt: skip


def baseline_targets(now: list[dict], before: list[dict]) -> list[dict]:
    targets = []
    for row in baseline_rows_spec():
        ratio = summary([a[row.name]["usec_per_call"] / b[row.name]["usec_per_call"] for a, b in zip(now, before)])
        targets.append(target(f"{row.name}: within {round((BASELINE_LIMIT - 1) * 100)}% of the previous build",
                              ratio, BASELINE_LIMIT,
                              "TB.TAKE usec_per_call, this build / the previous build's, same run, interleaved"))  # fmt: skip
    return targets


def peer_rows(configs: dict) -> list[list[str]]:
    """TB.TAKE / CL.THROTTLE per configuration, keys and path: cost ratio
    (lower is better) and throughput ratio (higher is better), each computed
    within a repetition."""
    out = []
    for cfg_name, per_rep in configs.items():
        for keys in ("random", "hot"):
            for path in ("allowed", "denied"):
                tb, cl = f"TB.TAKE / {keys} / {path}", f"CL.THROTTLE / {keys} / {path}"
                if not all(tb in rep and cl in rep for rep in per_rep):
                    continue
                us = ratio_summary(per_rep, tb, cl, "usec_per_call")
                rps = ratio_summary(per_rep, tb, cl, "rps")
                tb_us = median([rep[tb]["usec_per_call"] for rep in per_rep])
                cl_us = median([rep[cl]["usec_per_call"] for rep in per_rep])
                out.append([cfg_name, keys, path, fmt(tb_us), fmt(cl_us),
                            *median_range(us, 3, "x"), *median_range(rps, 3, "x")])  # fmt: skip
    return out


PEER_HEAD = ["config", "keys", "path", "TB.TAKE us", "CL.THROTTLE us", "us ratio", "range",
             "throughput ratio", "range"]  # fmt: skip


# --------------------------------------------------------------------------
# Output: text table, markdown, JSON, SVG


def fmt(x, digits=2):
    # Plain fixed point, not harness.fmt's grouped figures: the form
    # results.md and lease-results.md have always had.
    return "-" if x is None else f"{x:.{digits}f}"


def median_range(s: dict, digits: int = 2, unit: str = "") -> list[str]:
    """A summary's two cells, the median (with its unit) and the min-max
    range: every table here shows a figure that way."""
    return [f"{fmt(s['median'], digits)}{unit}", f"{fmt(s['min'], digits)}-{fmt(s['max'], digits)}"]


def row_table(configs: dict, rows: list[Row]) -> list[list[str]]:
    table = []
    for cfg_name, per_rep in configs.items():
        for row in rows:
            usec = summary([rep[row.name]["usec_per_call"] for rep in per_rep])
            kops = summary([rep[row.name]["rps"] / 1000 for rep in per_rep])
            allowed = median([rep[row.name]["allowed_share"] for rep in per_rep if rep[row.name]["allowed_share"] is not None])
            table.append([
                cfg_name, row.impl, row.keys, row.path, str(per_rep[0][row.name]["n"]),
                *median_range(usec), f"{usec['spread_pct']:.0f}%",
                *median_range(kops, 1), f"{kops['spread_pct']:.0f}%",
                "-" if allowed is None else f"{allowed:.0%}",
            ])  # fmt: skip
    return table


ROW_HEAD = ["config", "command", "keys", "path", "n", "us/call", "range", "spread",
            "kops/s", "range", "spread", "allowed"]  # fmt: skip


def target_rows(targets) -> list[list[str]]:
    out = []
    for t in targets:
        unit = t.get("unit", "x")
        op = ">=" if t.get("higher_is_better") else "<="
        out.append(["met" if t["met"] else "MISSED", t["target"], *median_range(t["ratio"], 3, unit),
                    f"{op} {t['limit']}{unit}", t["how"]])  # fmt: skip
    return out


TARGET_HEAD = ["", "target", "median", "range", "limit", "measured as"]


def sample_text(sample: dict) -> str:
    """A sampled bucket's stored value: its tokens text, or every field of a
    value that has none (redis-cell's)."""
    fields = sample["fields"]
    return fields.get("tokens") or " ".join(f"{k}={v}" for k, v in fields.items())


def memory_rows(memory) -> list[list[str]]:
    return [[name, *median_range(m["delta"], 1), fmt(m["usage"]["median"], 0), sample_text(m["sample"]),
             str(m["sample"]["pttl_ms"])] for name, m in memory["impls"].items()]  # fmt: skip


MEM_HEAD = ["impl", "used_memory B/bucket", "range", "MEMORY USAGE B", "sample tokens text (or value)", "sample PTTL ms"]


def repl_rows(repl) -> list[list[str]]:
    out = []
    for name, e in repl["cases"].items():
        a = e["allowed_share"]
        out.append([name, *median_range(e["bytes_per_call"], 1), fmt(e["usec_per_call_with_replica"]["median"]),
                    "-" if a is None else f"{a:.0%}", f"{e['replica_keys_share']:.0%}"])  # fmt: skip
    return out


REPL_HEAD = ["case", "repl bytes/call", "range", "us/call (replica attached)", "allowed",
             "master's keys on the replica"]  # fmt: skip


def esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def hbar_panel(x, y, w, title, unit, groups, series, digits=1):
    """Horizontal bars. groups: [(label, {series: (median, lo, hi)})]."""
    bar_h, gap, label_w = 13, 10, 150
    names = [s for s, _ in series]
    inner_h = len(groups) * (len(names) * bar_h + gap)
    h = inner_h + 62
    vmax = max((v[2] or v[0]) for _, vals in groups for v in vals.values() if v[0] is not None) or 1
    plot_w = w - label_w - 70
    out = [f'<g transform="translate({x},{y})">',
           f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff" stroke="#ddd"/>',
           f'<text x="10" y="20" font-size="14" font-weight="bold">{esc(title)}</text>']  # fmt: skip
    lx = label_w
    for i, (sname, color) in enumerate(series):
        out.append(f'<rect x="{lx}" y="28" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + 14}" y="37" font-size="11">{esc(sname)}</text>')
        lx += 24 + 7 * len(sname)
    gy = 48
    for label, vals in groups:
        out.append(f'<text x="{label_w - 6}" y="{gy + len(names) * bar_h / 2 + 4}" font-size="11" '
                   f'text-anchor="end">{esc(label)}</text>')  # fmt: skip
        for sname, color in series:
            v = vals.get(sname)
            if v is not None and v[0] is not None:
                med, lo, hi = v
                bw = max(1.0, med / vmax * plot_w)
                out.append(f'<rect x="{label_w}" y="{gy}" width="{bw:.1f}" height="{bar_h - 2}" fill="{color}"/>')
                if lo is not None and hi is not None and hi > lo:
                    x0, x1 = label_w + lo / vmax * plot_w, label_w + hi / vmax * plot_w
                    cy = gy + (bar_h - 2) / 2
                    out.append(f'<line x1="{x0:.1f}" y1="{cy}" x2="{x1:.1f}" y2="{cy}" stroke="#333"/>')
                out.append(f'<text x="{label_w + max(bw, (hi or 0) / vmax * plot_w) + 4:.1f}" y="{gy + 10}" '
                           f'font-size="10">{med:.{digits}f} {esc(unit)}</text>')  # fmt: skip
            gy += bar_h
        gy += gap
    out.append("</g>")
    return "\n".join(out), h


def render_svg(results: dict) -> str:
    colors = {"no AOF": "#4878a8", "AOF everysec": "#e8a33d", "allowed": "#4878a8", "denied": "#c44e52",
              "used_memory delta": "#4878a8", "MEMORY USAGE": "#8c8c8c"}  # fmt: skip
    cfgs = [("plain", "no AOF"), ("aof", "AOF everysec")]
    shown = ["PING", "INCR / random", "HSET / random", "Lua (TIME) / random / allowed",
             "Lua (client now) / random / allowed", "CL.THROTTLE / random / allowed", "TB.TAKE / random / allowed",
             "Lua (TIME) / random / denied", "CL.THROTTLE / random / denied", "TB.TAKE / random / denied"]  # fmt: skip
    first = next(iter(results["rows"].values()))[0]
    shown = [name for name in shown if name in first]
    label = lambda n: n.replace(" / random", "").replace(" / allowed", " allowed").replace(" / denied", " denied")  # noqa: E731

    def groups(metric, scale=1.0):
        out = []
        for name in shown:
            vals = {}
            for cfg, sname in cfgs:
                per_rep = results["rows"].get(cfg)
                if per_rep:
                    s = summary([rep[name][metric] * scale for rep in per_rep])
                    vals[sname] = (s["median"], s["min"], s["max"])
            out.append((label(name), vals))
        return out

    W = 520
    series = [(s, colors[s]) for _, s in cfgs]
    p1, h1 = hbar_panel(10, 60, W, "Server cost per call (commandstats, random keys)", "us", groups("usec_per_call"), series, 2)
    p2, h2 = hbar_panel(20 + W, 60, W, f"Throughput, redis-benchmark -P {PIPELINE} -c {CLIENTS}", "k/s", groups("rps", 1e-3), series, 0)
    repl = results["replication"]["cases"]
    rg = []
    for impl in ("HSET", "Lua (TIME)", "Lua (client now)", "CL.THROTTLE", "TB.TAKE"):
        if not any(name.startswith(impl) for name in repl):
            continue
        vals = {}
        for path in ("allowed", "denied"):
            e = repl.get(f"{impl} / {path}") or (repl.get(impl) if path == "allowed" else None)
            if e:
                b = e["bytes_per_call"]
                vals[path] = (b["median"], b["min"], b["max"])
        rg.append((impl, vals))
    y2 = 70 + max(h1, h2)
    p3, h3 = hbar_panel(10, y2, W, "Replication bytes per call (master_repl_offset)", "B", rg,
                        [("allowed", colors["allowed"]), ("denied", colors["denied"])], 1)  # fmt: skip
    mg = []
    for impl, m in results["memory"]["impls"].items():
        mg.append((impl, {"used_memory delta": (m["delta"]["median"], m["delta"]["min"], m["delta"]["max"]),
                          "MEMORY USAGE": (m["usage"]["median"], m["usage"]["min"], m["usage"]["max"])}))  # fmt: skip
    p4, h4 = hbar_panel(20 + W, y2, W, f"Memory per bucket ({results['memory']['buckets']:,} buckets)", "B", mg,
                        [("used_memory delta", colors["used_memory delta"]), ("MEMORY USAGE", colors["MEMORY USAGE"])], 1)  # fmt: skip
    y3 = y2 + max(h3, h4) + 10
    tlines = [f'<g transform="translate(10,{y3})">',
              f'<rect x="0" y="0" width="{2 * W + 10}" height="{32 + 17 * len(results["targets"])}" fill="#fff" stroke="#ddd"/>',
              '<text x="10" y="20" font-size="14" font-weight="bold">Targets (ratios within each repetition, random keys, allowed path)</text>']  # fmt: skip
    for i, t in enumerate(results["targets"]):
        r = t["ratio"]
        unit = t.get("unit", "x")
        color = "#2e7d32" if t["met"] else "#c62828"
        ty = 40 + 17 * i
        tlines.append(f'<text x="10" y="{ty}" font-size="11" font-weight="bold" fill="{color}">'
                      f'{"met" if t["met"] else "missed"}</text>')  # fmt: skip
        tlines.append(f'<text x="70" y="{ty}" font-size="11">{esc(t["target"])}: '
                      f'{r["median"]:.3g}{esc(unit)} (range {r["min"]:.3g}-{r["max"]:.3g})</text>')  # fmt: skip
    tlines.append("</g>")
    height = y3 + 32 + 17 * len(results["targets"]) + 10
    meta = results["meta"]
    sub = (f"{meta['server']} {meta['server_version']}, {meta['cpus']} CPUs, medians of {meta['reps']} runs "
           f"(whiskers: min-max), {meta['date']}")  # fmt: skip
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 30}" height="{height}" '
        f'viewBox="0 0 {2 * W + 30} {height}" font-family="Helvetica, Arial, sans-serif">',
        f'<rect width="100%" height="100%" fill="#fafafa"/>',
        '<text x="10" y="26" font-size="18" font-weight="bold">redis-tb: TB.TAKE vs the Lua token bucket'
        + (" and redis-cell's CL.THROTTLE" if meta.get("peer_module") else "") + "</text>",
        f'<text x="10" y="46" font-size="12" fill="#555">{esc(sub)}</text>',
        p1, p2, p3, p4, "\n".join(tlines), "</svg>", "",
    ])  # fmt: skip


# --------------------------------------------------------------------------


def peer_text(meta: dict) -> str:
    if not meta.get("peer_module"):
        return f"Peer: redis-cell's CL.THROTTLE was not measured: {meta.get('peer_missing')}."
    return ("Peer: redis-cell 0.2.2 (crates.io, built by scripts/build-redis-cell.sh outside the tree), "
            "loaded beside the module; CL.THROTTLE key " + " ".join(CL_ALLOW) + " for the allowed rows "
            "(rate 0.001/s like TB.TAKE's; burst 10^6, since redis-cell's nanosecond i64 arithmetic "
            "overflows for 10^9 at that rate) and " + " ".join(CL_DENY) + " on drained keys for the denied rows.")  # fmt: skip


def git_rev() -> str:
    # A changed or new file under src/ changes the module these figures are of.
    return harness_git_rev("src", mark="+dirty-src", untracked=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", 3)))
    ap.add_argument("--scale", type=float, default=float(os.environ.get("BENCH_SCALE", 1.0)),
                    help="multiplies the request counts (0.1 for a quick smoke run)")  # fmt: skip
    ap.add_argument("--server", default=os.environ.get("TB_SERVER", "redis-server"))
    ap.add_argument("--module", default=os.environ.get("TB_MODULE", str(ROOT / "target/release/libredis_tb.so")))
    ap.add_argument("--out", default=str(RESULTS_DIR), help="where results.json/.md and chart.svg go")
    ap.add_argument("--no-aof", action="store_true", help="skip the AOF rows")
    ap.add_argument("--peer-module", default=os.environ.get("TB_PEER_MODULE", ""),
                    help="redis-cell's .so (scripts/build-redis-cell.sh), loaded beside the module "
                         "for the CL.THROTTLE rows; empty: no CL.THROTTLE rows")  # fmt: skip
    ap.add_argument("--peer-missing", default=os.environ.get("TB_PEER_MISSING", ""),
                    help="why there is no peer module (printed and recorded)")
    ap.add_argument("--baseline-module", default=os.environ.get("BENCH_BASELINE", ""),
                    help="the previous build's .so, for the row that checks TB.TAKE kept its cost")
    ap.add_argument("--floor-module", default=os.environ.get("TB_FLOOR_MODULE", str(FLOOR_BUILD)),
                    help="the bench-floor build, for TB.TAKE's floor row")
    ap.add_argument("--rows", default="",
                    help="only the cost rows whose name contains one of these comma-separated "
                         "strings, and no memory or replication part (for quick comparisons)")  # fmt: skip
    args = ap.parse_args()
    if args.reps < 3:
        print("note: fewer than 3 repetitions; spreads mean little", file=sys.stderr)
    module = Path(args.module).resolve()
    if not module.exists():
        print(f"module not found: {module} (cargo build --release)", file=sys.stderr)
        return 1
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    peer = Path(args.peer_module).resolve() if args.peer_module else None
    peer_note = ""
    if peer is not None and not peer.exists():
        peer_note = f"{peer} does not exist"
        peer = None
    elif peer is None:
        peer_note = args.peer_missing or "no peer module given (--peer-module / TB_PEER_MODULE)"

    atexit.register(stop_all)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(130))

    t0 = time.monotonic()
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    lua = LUA_PATH.read_text()

    if peer is not None:
        try:
            probe = Server(args.server, module, "peer-probe", peer=peer)
            with probe.conn() as c:
                c.call("CL.THROTTLE", "probe", *CL_ALLOW)
            probe.stop()
        except (RuntimeError, ReplyError, OSError) as e:
            peer_note = f"{peer} did not load or run in {args.server}: {str(e).strip()[-300:]}"
            peer = None
    if peer is None:
        log(f"peer: redis-cell (CL.THROTTLE) not measured: {peer_note}")

    plain = Server(args.server, module, "plain", peer=peer)
    with plain.conn() as c:
        info = c.info("server")
        sha = c.call("SCRIPT", "LOAD", lua).decode()
        modules = c.call("MODULE", "LIST")
    server_name = info.get("server_name", "redis")
    version = info.get("valkey_version") or info.get("redis_version")
    bench_version = subprocess.run(["redis-benchmark", "--version"], capture_output=True, text=True).stdout.strip()
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "server": server_name, "server_version": version,
        "server_binary": shutil.which(args.server) or args.server,
        "redis_benchmark": bench_version, "module": str(module),
        "module_list": [[x.decode() if isinstance(x, bytes) else x for x in m] for m in modules],
        "git": git_rev(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
        "python": platform.python_version(), "reps": args.reps, "scale": args.scale,
        "pipeline": PIPELINE, "clients": CLIENTS, "keyspace": KEYSPACE,
        "allowed_params": ALLOW, "denied_params": DENY, "lua_sha": sha,
        "peer_module": str(peer) if peer else None, "peer_missing": None if peer else peer_note,
        "peer_allowed_params": CL_ALLOW, "peer_denied_params": CL_DENY,
        "lua_clock": ("'Lua (TIME)' reads now from redis.call('TIME') inside the script (one extra "
                      "redis.call); 'Lua (client now)' passes a fixed ARGV[4]=" + CLIENT_NOW +
                      " as the seed's caller would (a fixed value, since redis-benchmark sends the same "
                      "text every call), so that variant never refills during a run"),
    }  # fmt: skip
    log(f"server: {server_name} {version} ({meta['server_binary']}), {bench_version}")
    log(f"module: {module} (git {meta['git']}); {meta['cpus']} CPUs; load {meta['loadavg_start']}")
    log(f"each row: redis-benchmark -c {CLIENTS} -P {PIPELINE} -r {KEYSPACE}; {args.reps} interleaved repetitions")
    log(f"Lua clock: {meta['lua_clock']}")
    if peer:
        log(f"peer: {peer}: CL.THROTTLE key {' '.join(CL_ALLOW)} (allowed), {' '.join(CL_DENY)} (denied, drained)")

    rows = make_rows(sha, peer is not None)
    only = [x for x in args.rows.split(",") if x]
    if only:
        rows = [r for r in rows if any(x in r.name for x in only)]
    results: dict = {"meta": meta}

    configs = {"plain": (plain, False)}
    if not args.no_aof:
        aof = Server(args.server, module, "aof", ["--appendonly", "yes", "--appendfsync", "everysec",
                                                   "--auto-aof-rewrite-percentage", "0"], peer=peer)  # fmt: skip
        with aof.conn() as c:
            c.call("SCRIPT", "LOAD", lua)
        configs["aof"] = (aof, True)
    log("\n== cost and throughput: no AOF ('plain') and AOF appendfsync everysec ('aof'), rows interleaved")
    results["rows"] = bench_rows(configs, rows, args.reps, args.scale, log)
    if not args.no_aof:
        aof.stop()
    want_scaling = not only or any(x == "scaling" or any(x in n for n in scaling_names()) for x in only)
    if want_scaling:
        log(f"\n== TB.TAKEALL over {' and '.join(f'{n:,}' for n in SCALING_SIZES)} keys in one call, next to MSET")
        results["scaling"] = bench_scaling(plain, args.reps, args.scale, log)
    if only:
        # A quick comparison: medians only, nothing written.
        for name, per_rep in results["rows"].items():
            for row in rows:
                us = median([rep[row.name]["usec_per_call"] for rep in per_rep])
                kops = median([rep[row.name]["rps"] for rep in per_rep]) / 1000
                log(f"  {name:<5} {row.name:<38} {us:7.3f} us/call {kops:8.1f} kops/s")
        if peer and rows:
            log("\nTB.TAKE / CL.THROTTLE\n" + text_table(PEER_HEAD, peer_rows(results["rows"])))
        if want_scaling:
            log("\n" + text_table(SCALING_HEAD, scaling_rows(results["scaling"])))
        plain.stop()
        return 0

    log("\n== memory per bucket")
    results["memory"] = bench_memory(plain, sha, args.reps, args.scale, log, peer is not None)
    plain.stop()

    log("\n== replication bytes per call (replica attached, repl-ping-replica-period 3600)")
    master = Server(args.server, module, "master", ["--repl-ping-replica-period", "3600"], peer=peer)
    replica = Server(args.server, module, "replica", ["--replicaof", "127.0.0.1", str(master.port)], peer=peer)
    wait_replica_online(master, replica)
    with master.conn() as c:
        c.call("SCRIPT", "LOAD", lua)
    results["replication"] = bench_replication(master, replica, sha, args.reps, args.scale, log, peer is not None)
    replica.stop()
    master.stop()

    results["targets"] = evaluate_targets(results["rows"], results["memory"], results["replication"],
                                          results.get("scaling"), peer is not None)  # fmt: skip
    floor_module = Path(args.floor_module)
    if floor_module.exists():
        log(f"\n== TB.TAKE against its module floor, and TB.THROTTLE ({floor_module})")
        floor_server = Server(args.server, floor_module.resolve(), "floor")
        results["floor"] = bench_rows({"floor": (floor_server, False)}, floor_rows_spec(), args.reps,
                                      args.scale, log)["floor"]  # fmt: skip
        floor_server.stop()
        results["targets"] += floor_targets(results["floor"])
    else:
        log(f"floor: {floor_module} not built (scripts/bench.sh builds it); no floor rows")
    if args.baseline_module and Path(args.baseline_module).exists():
        baseline = Path(args.baseline_module).resolve()
        log(f"\n== plain TB.TAKE against the previous build ({baseline})")
        meta["baseline_module"] = str(baseline)
        pair = {"this": (Server(args.server, module, "this"), False),
                "previous": (Server(args.server, baseline, "previous"), False)}  # fmt: skip
        results["baseline"] = bench_rows(pair, baseline_rows_spec(), args.reps, args.scale, log)
        for server, _ in pair.values():
            server.stop()
        results["targets"] += baseline_targets(results["baseline"]["this"], results["baseline"]["previous"])
    else:
        log("baseline: no previous build given (BENCH_BASELINE); no such row")
    meta["seconds"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = os.getloadavg()

    rtab = row_table(results["rows"], rows)
    sections = [
        ("Cost per call and throughput (medians of %d; range = min-max)" % args.reps, ROW_HEAD, rtab),
        ("TB.TAKE / CL.THROTTLE (redis-cell 0.2.2), ratios within each repetition"
         + ("" if peer else f": not measured ({peer_note})"), PEER_HEAD, peer_rows(results["rows"])),
        ("Memory per bucket (%d buckets, TB.TAKE/EVALSHA %s twice, 1 s apart)"
         % (results["memory"]["buckets"], " ".join(MEM_PARAMS)), MEM_HEAD, memory_rows(results["memory"])),
        ("Replication (%d calls per case, random keys)" % results["replication"]["calls"], REPL_HEAD,
         repl_rows(results["replication"])),
        ("TB.TAKEALL over many keys in one call, next to MSET (plain, medians of %d)" % args.reps,
         SCALING_HEAD, scaling_rows(results["scaling"])),
        ("Targets (ratios within each repetition; random keys, allowed path)", TARGET_HEAD, target_rows(results["targets"])),
    ]  # fmt: skip
    header = (f"{server_name} {version}; {bench_version}; module git {meta['git']}; {meta['cpus']} CPUs; "
              f"{meta['date']}; {meta['seconds']:.0f} s")  # fmt: skip
    print("\n" + header)
    for title, head, body in sections:
        print(f"\n{title}\n" + text_table(head, body))
    print("\nLua clock: " + meta["lua_clock"])
    print(peer_text(meta))

    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    md = ["# redis-tb benchmark results", "", f"_{header}_", "",
          "Produced by `make bench` (scripts/bench.sh). Server cost = `usec/calls` from `INFO commandstats`; "
          f"throughput = `redis-benchmark -c {CLIENTS} -P {PIPELINE} -r {KEYSPACE}`. "
          f"Allowed rows: capacity/rate/n = {' '.join(ALLOW)}; denied rows: {' '.join(DENY)} on drained buckets. "
          f"{meta['lua_clock']}. {peer_text(meta)}", "", "![benchmark chart](chart.svg)", ""]  # fmt: skip
    for title, head, body in sections:
        md += [f"## {title}", "", md_table(head, body), ""]
    (out_dir / "results.md").write_text("\n".join(md))
    (out_dir / "chart.svg").write_text(render_svg(results))
    print(f"\nwrote {out_dir / 'results.json'}, {out_dir / 'results.md'}, {out_dir / 'chart.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

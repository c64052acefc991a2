#!/usr/bin/env python3
"""Lease race: TB.ACQUIRE + TB.RELEASE against the Lua sorted-set semaphore.

Per server (Redis from PATH, every .cache/servers/valkey-*/valkey-server and
TB_BENCH_SERVERS, as bench/harness.py finds them; --servers picks), one
server is started with the module loaded (bench/harness.py's Server: loopback,
free port, temp dir, no persistence), lua/tb.lua is loaded as a FUNCTION
library and bench/lease_semaphore.lua with SCRIPT LOAD. Each row is one
acquire+release pair, repeated:

* TB.ACQUIRE key limit lease_ms, then TB.RELEASE key <the id it handed out>;
* Lua semaphore (TIME): EVALSHA of lease_semaphore.lua (ZREMRANGEBYSCORE key
  -inf now, ZCARD, ZADD, PEXPIRE, the clock from TIME), then a plain ZREM;
* Lua semaphore (client now): the same, the caller's clock passed as ARGV[4];
* tb.lua: FCALL tb_acquire, then FCALL tb_release (our own Lua twin).

Two scenarios: random keys (a key drawn from 10,000 per pair, limit 100) and
one hot key holding 50 long leases (limit 1,000). The client pipelines a batch
of acquires, checks every one was granted, then pipelines their releases and
checks every one released. Server time per pair = the usec that INFO
commandstats gives the row's two top-level commands (CONFIG RESETSTAT before
the row), / pairs: the "cost" bench/bench.py measures. Also recorded: the
server's CPU (INFO cpu used_cpu_user + used_cpu_sys deltas) per pair, which
includes reading and writing the sockets. Rows are interleaved per
repetition; ratios are computed within a repetition, medians over them.
Target: TB.ACQUIRE + TB.RELEASE <= 0.35x the cheaper Lua semaphore, per
scenario; printed MET or MISSED (a miss is recorded, not fatal).

Python 3.11 standard library; helpers imported from bench/harness.py and
bench/bench.py. Results:
bench/results/lease-results.md and bench/results/lease-results.json. Exit status 1 only on a
correctness failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (bench/bench.py: summary, fmt, median, git_rev)
from bench import summary  # noqa: E402
from harness import (ROOT, BENCH_DIR, RESULTS_DIR, ReplyError, Server, built_module, commandstats, cpu_seconds,  # noqa: E402
                     discover_servers, finish, generated_by, log, md_blocks, md_table, run_head, timed_run,
                     version_of)  # fmt: skip

SEMAPHORE_PATH = BENCH_DIR / "lease_semaphore.lua"
LIBRARY_PATH = ROOT / "lua" / "tb.lua"
TARGET_RATIO = 0.35
LEASE_MS = "30000"
BATCH = 200
BASE_PAIRS = 40_000


class Scenario:
    def __init__(self, name: str, keys: int, limit: int, held: int):
        self.name, self.keys, self.limit, self.held = name, keys, limit, held

    def key(self, rng: random.Random) -> str:
        return "lease:hot" if self.keys == 1 else "lease:%06d" % rng.randrange(self.keys)


SCENARIOS = [
    Scenario("random keys (10,000), limit 100", 10_000, 100, 0),
    Scenario("hot key, 50 held, limit 1,000", 1, 1000, 50),
]


class Impl:
    """One way to acquire and release: the commands, how to read a grant, what
    commandstats calls its top-level commands (`optional` ones may not run)."""

    def __init__(self, name, stats, acquire, granted, release, optional=(), reset=None):
        self.name, self.stats, self.optional = name, stats, list(optional)
        self.acquire, self.granted, self.release = acquire, granted, release
        self.reset = reset or (lambda: None)


FLOOR = "Floor: the same writes as plain commands"
MODULE_FLOOR = "Floor: the same writes by a module command"
FLOOR_BUILD = ROOT / "target" / "bench-floor" / "release" / "libredis_tb.so"


class FloorState:
    """What the floors' client keeps instead of reading the set: each key's
    count of ids and expiry, so it can send the values TB.ACQUIRE computes."""

    def __init__(self):
        self.issued, self.expiry = {}, {}

    def next(self, key, lease_ms):
        """(lease id, deadline, n, the new expiry or None) for an acquire now."""
        now = time.time_ns() // 1_000_000
        deadline = now + int(lease_ms)
        n = self.issued[key] = self.issued.get(key, 0) + 1
        grows = deadline > self.expiry.get(key, 0)
        if grows:
            self.expiry[key] = deadline
        return f"{now}-{n}", now, deadline, n, (deadline if grows else None)

    def reset(self):
        self.issued.clear()
        self.expiry.clear()


def floor_impl() -> Impl:
    """The writes TB.ACQUIRE + TB.RELEASE make, and replicate, sent as plain
    commands: `ZADD key <deadline> <id> <-n> seq`, `PEXPIREAT key <deadline>`
    when the key's expiry grows, `ZREM key <id>`. No reads, no checks, no
    module: what the data work alone costs the server."""
    state = FloorState()

    def acquire(key, limit, i, lease_ms=LEASE_MS):
        lease, _, deadline, n, expire_at = state.next(key, lease_ms)
        commands = [["ZADD", key, str(deadline), lease, str(-n), "seq"]]
        if expire_at is not None:
            commands.append(["PEXPIREAT", key, str(expire_at)])
        return commands, lease

    return Impl(FLOOR, ["zadd", "zrem"], acquire, lambda reply: reply in (1, 2),  # seq is new or moved
                lambda key, lease: ["ZREM", key, lease], optional=["pexpireat"], reset=state.reset)  # fmt: skip


def module_floor_impl() -> Impl:
    """The same writes by the bench-only commands of the `bench-floor` build
    (src/testing/bench_floor.rs): TB.ACQUIRE's own write, replication and reply code, with
    the values from the client, so no read and no check. The least a module
    command can spend on an acquire and a release with this layout."""
    state = FloorState()

    def acquire(key, limit, i, lease_ms=LEASE_MS):
        lease, now, deadline, n, expire_at = state.next(key, lease_ms)
        return [["TB.FLOOR.ACQUIRE", key, str(deadline), str(now), str(n), str(expire_at or 0)]], lease

    return Impl(MODULE_FLOOR, ["tb.floor.acquire", "tb.floor.release"], acquire,
                lambda reply: isinstance(reply, list) and reply[0] == 1,
                lambda key, lease: ["TB.FLOOR.RELEASE", key, lease], reset=state.reset)  # fmt: skip


def make_impls(sha: str, module_floor: bool) -> list[Impl]:
    def lease_id(reply):
        return reply[3] if isinstance(reply, list) and reply[0] == 1 else None

    def holder(i):
        return "h%015x" % i  # as long as a lease id, about

    def semaphore(clock: bool):
        def acquire(key, limit, i, lease_ms=LEASE_MS):
            args = ["EVALSHA", sha, "1", key, str(limit), lease_ms, holder(i)]
            if clock:
                args.append(str(time.time_ns() // 1_000_000))
            return [args], holder(i)

        return acquire

    return [
        Impl("TB.ACQUIRE + TB.RELEASE", ["tb.acquire", "tb.release"],
             lambda key, limit, i, lease_ms=LEASE_MS: ([["TB.ACQUIRE", key, str(limit), lease_ms]], None),
             lease_id, lambda key, lease: ["TB.RELEASE", key, lease]),
        Impl("Lua semaphore (TIME) + ZREM", ["evalsha", "zrem"], semaphore(False),
             lambda reply: reply == 1, lambda key, lease: ["ZREM", key, lease]),
        Impl("Lua semaphore (client now) + ZREM", ["evalsha", "zrem"], semaphore(True),
             lambda reply: reply == 1, lambda key, lease: ["ZREM", key, lease]),
        Impl("tb.lua: FCALL tb_acquire + tb_release", ["fcall"],
             lambda key, limit, i, lease_ms=LEASE_MS: ([["FCALL", "tb_acquire", "1", key, str(limit), lease_ms]], None),
             lease_id, lambda key, lease: ["FCALL", "tb_release", "1", key, lease]),
        floor_impl(),
    ] + ([module_floor_impl()] if module_floor else [])  # fmt: skip


def run_row(c, impl: Impl, scenario: Scenario, pairs: int, seed: int) -> dict:
    """`pairs` acquire+release pairs of `impl` in `scenario`; server usec and CPU per pair."""
    rng = random.Random(seed)
    c.call("FLUSHALL")
    impl.reset()
    counter = 0
    for _ in range(scenario.held):
        counter += 1
        commands, lease = impl.acquire("lease:hot", scenario.limit, counter, "3600000")
        reply = c.pipeline(commands)[0]
        if impl.granted(reply) is None or impl.granted(reply) is False:
            raise RuntimeError(f"{impl.name}: a held lease was not granted: {reply!r}")
    c.call("CONFIG", "RESETSTAT")
    cpu0 = cpu_seconds(c)
    t0 = time.monotonic()
    done = 0
    while done < pairs:
        n = min(BATCH, pairs - done)
        keys = [scenario.key(rng) for _ in range(n)]
        acquires, leases, firsts = [], [], []
        for key in keys:
            counter += 1
            commands, lease = impl.acquire(key, scenario.limit, counter)
            firsts.append(len(acquires))
            acquires.extend(commands)
            leases.append(lease)
        replies = c.pipeline(acquires)
        replies = [replies[i] for i in firsts]  # each pair's grant is its first reply
        releases = []
        for key, reply, lease in zip(keys, replies, leases):
            granted = impl.granted(reply)
            if granted is None or granted is False:
                raise RuntimeError(f"{impl.name}: acquire on {key} not granted: {reply!r}")
            releases.append(impl.release(key, lease if lease is not None else granted))
        replies = c.pipeline(releases)
        if any(r != 1 for r in replies):
            raise RuntimeError(f"{impl.name}: a release did not release: {replies[:5]!r}")
        done += n
    elapsed = time.monotonic() - t0
    cpu = cpu_seconds(c) - cpu0
    stats = commandstats(c)
    usec = 0.0
    per_command = {}
    for name in impl.stats + impl.optional:
        s = stats.get(name)
        want = pairs * (2 if len(impl.stats) == 1 else 1)
        if name in impl.optional and not s:
            continue
        if not s or (name not in impl.optional and s["calls"] < want):
            raise RuntimeError(f"{impl.name}: commandstats {name} = {s} for {pairs} pairs")
        if s.get("failed_calls", 0) or s.get("rejected_calls", 0):
            raise RuntimeError(f"{impl.name}: failed calls: {name} {s}")
        usec += s["usec"]
        per_command[name] = s["usec"] / s["calls"]
    left = c.call("ZCARD", "lease:hot") if scenario.keys == 1 else None
    if left is not None and left - (1 if impl.name.startswith(("TB.", "tb.lua", "Floor")) else 0) != scenario.held:
        raise RuntimeError(f"{impl.name}: {left} members left on the hot key, {scenario.held} held")
    return {"usec_per_pair": usec / pairs, "cpu_us_per_pair": cpu * 1e6 / pairs,
            "pairs_per_s": pairs / elapsed, "pairs": pairs, "usec_per_call": per_command}  # fmt: skip


def run_server(name: str, binary: str, module: Path, reps: int, scale: float, log) -> dict:
    server = Server(binary, module, "lease-" + name)
    try:
        with server.conn() as c:
            version = version_of(c)
            sha = c.call("SCRIPT", "LOAD", SEMAPHORE_PATH.read_text()).decode()
            c.call("FUNCTION", "LOAD", "REPLACE", LIBRARY_PATH.read_text())
            # The bench-floor build has TB.FLOOR.*; any other build gets no such row.
            module_floor = bool(c.call("COMMAND", "INFO", "tb.floor.acquire")[0])
            impls = make_impls(sha, module_floor)
            pairs = max(1000, int(BASE_PAIRS * scale))
            per_rep = []
            for rep in range(reps):
                results = {}
                for scenario in SCENARIOS:
                    for impl in impls:
                        r = run_row(c, impl, scenario, pairs, seed=rep)
                        results[f"{scenario.name} | {impl.name}"] = r
                        log(f"  {version} rep {rep + 1}: {scenario.name:<32} {impl.name:<38} "
                            f"{r['usec_per_pair']:6.2f} us/pair  CPU {r['cpu_us_per_pair']:6.2f} us/pair")
                per_rep.append(results)
    finally:
        server.stop()
    run = {"name": name, "binary": binary, "version": version, "pairs": pairs, "per_rep": per_rep,
           "loadavg": os.getloadavg(), "targets": [], "floors": []}  # fmt: skip
    tb = "TB.ACQUIRE + TB.RELEASE"
    luas = ["Lua semaphore (TIME) + ZREM", "Lua semaphore (client now) + ZREM"]
    for scenario in SCENARIOS:
        row = lambda rep, impl: rep[f"{scenario.name} | {impl}"]  # noqa: E731
        for field in ("usec_per_pair", "cpu_us_per_pair"):
            # Against the cheaper Lua variant of each repetition: the stricter test.
            ratio = summary([row(rep, tb)[field] / min(row(rep, l)[field] for l in luas) for rep in per_rep])
            run["targets"].append({"scenario": scenario.name, "measure": field, "ratio": ratio,
                                   "met": ratio["median"] <= TARGET_RATIO})  # fmt: skip
        field = "usec_per_pair"
        cheaper_lua = [min(row(rep, l)[field] for l in luas) for rep in per_rep]
        for floor in (FLOOR, MODULE_FLOOR):
            if f"{scenario.name} | {floor}" not in per_rep[0]:
                continue
            run["floors"].append({
                "scenario": scenario.name,
                "floor": floor,
                "floor_us": summary([row(rep, floor)[field] for rep in per_rep]),
                "floor_ratio": summary([row(rep, floor)[field] / lua for rep, lua in zip(per_rep, cheaper_lua)]),
                "tb_over_floor_us": summary([row(rep, tb)[field] - row(rep, floor)[field] for rep in per_rep]),
                "room_us": summary([TARGET_RATIO * lua - row(rep, floor)[field] for rep, lua in zip(per_rep, cheaper_lua)]),
            })  # fmt: skip
    return run


MEASURES = {"usec_per_pair": "commandstats us/pair", "cpu_us_per_pair": "server CPU us/pair"}


def result_rows(results):
    head = ["server", "scenario", "pair", "commandstats us/pair", "range", "us/call by command",
            "CPU us/pair", "range", "kpairs/s"]  # fmt: skip
    rows = []
    for run in results["runs"]:
        for key in run["per_rep"][0]:
            scenario, impl = key.split(" | ")
            us = summary([rep[key]["usec_per_pair"] for rep in run["per_rep"]])
            cpu = summary([rep[key]["cpu_us_per_pair"] for rep in run["per_rep"]])
            kps = summary([rep[key]["pairs_per_s"] / 1000 for rep in run["per_rep"]])
            by_command = ", ".join(
                f"{name} {bench.fmt(bench.median([rep[key]['usec_per_call'][name] for rep in run['per_rep']]))}"
                for name in run["per_rep"][0][key]["usec_per_call"])  # fmt: skip
            rows.append([run["version"], scenario, impl, *bench.median_range(us), by_command,
                         *bench.median_range(cpu), bench.fmt(kps["median"], 1)])  # fmt: skip
    return head, rows


def target_rows(results):
    head = ["", "server", "scenario", "measure", "TB / cheaper Lua semaphore", "range", "limit"]
    rows = []
    for run in results["runs"]:
        for t in run["targets"]:
            r = t["ratio"]
            primary = t["measure"] == "usec_per_pair"
            verdict = ("MET" if t["met"] else "MISSED") if primary else ("(met)" if t["met"] else "(missed)")
            rows.append([verdict, run["version"], t["scenario"], MEASURES[t["measure"]],
                         *bench.median_range(r, 3, "x"), f"<= {TARGET_RATIO}x"])  # fmt: skip
    return head, rows


def floor_rows(results):
    head = ["server", "scenario", "floor", "us/pair", "/ cheaper Lua semaphore",
            "TB.ACQUIRE + TB.RELEASE over it, us/pair", f"left at {TARGET_RATIO}x for the rest, us/pair"]  # fmt: skip
    rows = []
    for run in results["runs"]:
        for f in run.get("floors", []):
            what = "plain commands" if f["floor"] == FLOOR else "module command"
            rows.append([run["version"], f["scenario"], what, bench.fmt(f["floor_us"]["median"]),
                         f"{bench.fmt(f['floor_ratio']['median'], 3)}x", bench.fmt(f["tb_over_floor_us"]["median"]),
                         bench.fmt(f["room_us"]["median"])])  # fmt: skip
    return head, rows


FLOOR_TEXT = f"""\
Two floors, both given the values TB.ACQUIRE would compute (the client keeps each key's id
count and expiry), so they read and check nothing. **Plain commands** ("{FLOOR}"): the writes
TB.ACQUIRE and TB.RELEASE make and replicate, sent as `ZADD key <deadline> <id> <-n> seq`,
`PEXPIREAT key <deadline>` when the key's expiry grows, and `ZREM key <id>` (commandstats
zadd + pexpireat + zrem / pairs): what the stored layout costs the server by itself; the
server propagates a plain command without rebuilding it. **Module command** ("{MODULE_FLOOR}"):
`TB.FLOOR.ACQUIRE key <deadline> <ms> <n> <expire_at>` and `TB.FLOOR.RELEASE key <id>` of the
bench-only `bench-floor` build (src/testing/bench_floor.rs; `make bench` builds it into target/bench-floor and
this script loads it): TB.ACQUIRE's own write, `RM_Replicate` and reply code: the least a
module command can spend per pair with this layout and effects replication. "Left at
{TARGET_RATIO}x" is the target's time less a floor: what is left for reading the set and the expiry,
deciding and making the id."""


METHOD = f"""\
Method. One server per binary, started by the script (loopback, free port, temp dir,
`--save ''`, `appendonly no`, module loaded); `lua/tb.lua` loaded with FUNCTION LOAD and
`bench/lease_semaphore.lua` with SCRIPT LOAD. A row is one acquire+release pair, run
{BASE_PAIRS:,} times (x `--scale`): the client pipelines {BATCH} acquires, checks each was
granted, then pipelines their {BATCH} releases and checks each replied 1. **TB.ACQUIRE +
TB.RELEASE**: `TB.ACQUIRE key limit {LEASE_MS}`, `TB.RELEASE key <id>`. **Lua semaphore**:
`EVALSHA <sha> 1 key limit {LEASE_MS} <holder> [now]` (ZREMRANGEBYSCORE key -inf now, ZCARD,
ZADD key now+lease_ms holder, PEXPIRE key lease_ms; the clock from TIME, or the caller's
as ARGV[4]), then `ZREM key <holder>`; the holder ids are 16 bytes, about as long as a lease
id. **tb.lua**: `FCALL tb_acquire 1 key limit {LEASE_MS}`, `FCALL tb_release 1 key <id>`.
Scenarios: a key drawn at random from 10,000 per pair (limit 100), and one hot key that
holds 50 leases of an hour (limit 1,000) so every call works on a 50-51 member set.
**Server time per pair**: the `usec` INFO commandstats gives the row's top-level commands
(tb.acquire + tb.release; evalsha + zrem; fcall), CONFIG RESETSTAT before the row, / pairs:
the cost `make bench` measures for TB.TAKE. **CPU per pair**: INFO cpu used_cpu_user +
used_cpu_sys over the row, / pairs (includes the sockets' reads and writes, the same for
every row). Rows interleave (every row once per repetition); ratios are taken within a
repetition against the cheaper Lua semaphore variant of that repetition, medians (min-max)
over the repetitions. Target: TB.ACQUIRE + TB.RELEASE <= {TARGET_RATIO}x the Lua semaphore's
commandstats time, per scenario. The machine is a shared 2-core VM; the load average is
recorded."""


def write_outputs(results: dict, out: Path):
    (out / "lease-results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    lines = md_blocks(
        "# Lease race: TB.ACQUIRE + TB.RELEASE against the Lua sorted-set semaphore",
        generated_by("lease_bench.py", results, timing=True) + f", {results['reps']} repetitions.",
        METHOD,
        "## Targets",
        md_table(*target_rows(results)),
        "## The floor: the stored writes alone",
        FLOOR_TEXT,
        md_table(*floor_rows(results)),
        "## Server time per acquire+release pair (medians, range = min-max)",
        md_table(*result_rows(results)),
        "## Servers",
    )
    lines += [f"- {run['version']}: `{run['binary']}`" for run in results["runs"]]
    lines.append("")
    if results["skipped"] or results["failures"]:
        lines += ["## Skipped or failed", ""] + [f"- {s}" for s in results["skipped"] + results["failures"]] + [""]
    (out / "lease-results.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", 3)))
    ap.add_argument("--scale", type=float, default=float(os.environ.get("BENCH_SCALE", 1.0)),
                    help="multiplies the pair count (0.1 for a quick smoke run)")  # fmt: skip
    ap.add_argument("--servers", help="comma list: only these servers (redis, valkey-9.1, ...)")
    # The bench-floor build only if it is newer than every source file: a
    # stale one would time old code (scripts/bench.sh rebuilds it first).
    newest_source = max(path.stat().st_mtime for path in (ROOT / "src").rglob("*.rs"))
    fresh = FLOOR_BUILD.exists() and FLOOR_BUILD.stat().st_mtime >= newest_source
    default_module = FLOOR_BUILD if fresh else ROOT / "target/release/libredis_tb.so"
    ap.add_argument("--module", default=os.environ.get("TB_LEASE_MODULE", str(default_module)),
                    help="module to load (default: the bench-floor build if built, which adds TB.FLOOR.*)")  # fmt: skip
    ap.add_argument("--out", default=str(RESULTS_DIR), help="where lease-results.md/.json go")
    args = ap.parse_args()
    module = built_module(args.module)

    servers, skipped = discover_servers(args.servers)
    for note in skipped:
        log(note)
    results = {
        **run_head(bench.git_rev(), module),
        "loadavg_start": os.getloadavg(),
        "reps": args.reps,
        "scale": args.scale,
        "lease_ms": LEASE_MS,
        "batch": BATCH,
        "target_ratio": TARGET_RATIO,
        "skipped": skipped,
        "failures": [],
        "runs": [],
    }
    with timed_run(results):
        for name, binary in servers:
            log(f"== {name}: {binary}")
            try:
                run = run_server(name, binary, module, args.reps, args.scale, log)
            except (RuntimeError, OSError, ReplyError) as e:
                log(f"{name}: FAILURE: {e}")
                results["failures"].append(f"{name}: {e}")
                continue
            results["runs"].append(run)
            for t in run["targets"]:
                if t["measure"] == "usec_per_pair":
                    log(f"  => {t['scenario']}: {t['ratio']['median']:.3f}x "
                        f"({'MET' if t['met'] else 'MISSED'}, target <= {TARGET_RATIO}x)")
    return finish(results, args.out, write_outputs, ("lease-results.md", "lease-results.json"),
                  bool(results["failures"]), tables=(target_rows, floor_rows, result_rows))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Hand-off race: N clients blocked on one key, one supply, TB.BTAKE vs BLPOP.

For each server (Redis from PATH, every .cache/servers/valkey-*/valkey-server,
and any binary listed in TB_BENCH_SERVERS, colon-separated; missing ones are
skipped with a note), started by this script (free loopback port, temp dir,
module loaded, `--save ''`, `--maxclients` N + 256), once with `appendonly no`
and once with `appendonly yes --appendfsync no`:

* TB.BTAKE side: the key is deleted and drained with TB.TAKE (capacity N,
  rate 0.000001/s: nothing refills during a run); each of N raw sockets sends
  `TB.BTAKE k N 0.000001 1 0`; once INFO tb shows tb_waiting == N, one
  `TB.REFUND k N 0.000001 N` supplies every token at once.
* BLPOP side, same server, same N sockets: each sends `BLPOP list 0`; once
  INFO clients shows blocked_clients == N, one `RPUSH list 0 1 ... N-1`
  supplies every element at once.

Measured per side: the time from sending the supply to the last of the N
replies (client clock), and the server's CPU (INFO cpu user+sys, read just
before the supply and just after the last reply) per served waiter. The
sides alternate (A B, B A, A B, ...) after one unmeasured warm-up round;
figures are medians over --rounds (default 3). Target: TB.BTAKE / BLPOP <= 1.2
for both time and CPU; each is printed MET or MISSED.

The timed wait is the same code for both sides: every socket is registered
once in an epoll set with EPOLLIN | EPOLLONESHOT, so the client's cost while
the server serves is one epoll_wait per batch of ready sockets, whatever N is,
and never a recv. The replies (one small write each, so a readable socket
holds its whole reply) are read and checked afterwards with selectors: every
client exactly one reply, TB.BTAKE each allowed with remaining N-1 ... 0 each
once, BLPOP each element once; then nothing more arrives, tb_waiting and
blocked_clients are back to 0, the bucket is empty and the list gone.

Python 3.11 standard library only. Exit status 1 only on a correctness failure;
a missed target is printed and recorded, not fatal. Results:
bench/results/handoff-results.md and bench/results/handoff-results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import selectors
import socket
import statistics
import sys
import time
from pathlib import Path

from harness import (ROOT, RESULTS_DIR, Conn, Incomplete, ReplyError, Server, ServerStartError, built_module,
                     discover_servers, encode, finish, fmt, generated_by, git_rev, log, md_blocks, md_table,
                     parse_one, raise_nofile, run_head, timed_run, version_of)  # fmt: skip

RATE = "0.000001"  # tokens per second: nothing refills during a run
TB_KEY = "handoff:tb"
LIST_KEY = "handoff:list"
TARGET_RATIO = 1.2
CONNECT_WAVE = 250  # sockets opened before waiting for the server to accept them
SETTLE_S = 0.1  # pause between "all blocked" and the supply, both sides
EXTRA_WAIT_S = 0.1  # how long a second reply is waited for after the last one
CONFIGS = {
    "plain": ["--appendonly", "no"],
    "aof": ["--appendonly", "yes", "--appendfsync", "no", "--auto-aof-rewrite-percentage", "0"],
}


# --------------------------------------------------------------------------
# Clients


def wait_until(c: Conn, section: str, field: str, want: int, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        got = int(float(c.info(section)[field]))
        if got == want:
            return
        if got > want:
            raise RuntimeError(f"{field} is {got}, more than the {want} expected ({what})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {field} stuck at {got}, expected {want}")
        time.sleep(0.005)


def open_clients(port: int, n: int, c: Conn) -> list[socket.socket]:
    socks: list[socket.socket] = []
    base = int(c.info("clients")["connected_clients"])
    try:
        for start in range(0, n, CONNECT_WAVE):
            for _ in range(start, min(n, start + CONNECT_WAVE)):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                socks.append(s)
            wait_until(c, "clients", "connected_clients", base + len(socks), "connecting")
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def race(c: Conn, socks: list[socket.socket], supply: bytes, timeout_s: float) -> dict:
    """Sends the supply, waits until every socket is readable; the client's
    work while the server serves is the same for both sides."""
    n = len(socks)
    ep = select.epoll(sizehint=n)
    try:
        for s in socks:
            ep.register(s.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
        time.sleep(SETTLE_S)
        cpu0 = c.cpu()
        t0 = time.perf_counter()
        c.sock.sendall(supply)
        seen = 0
        batches = 0
        first = last = None
        deadline = t0 + timeout_s
        while seen < n:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            events = ep.poll(left, n)
            now = time.perf_counter()
            if events:
                if first is None:
                    first = now
                seen += len(events)
                batches += 1
                last = now
        supply_reply = c.read()
        cpu1 = c.cpu()
    finally:
        ep.close()
    return {
        "first_ms": (first - t0) * 1e3 if first is not None else None,
        "last_ms": (last - t0) * 1e3 if seen >= n else None,
        "readable": seen,
        "batches": batches,
        "cpu_user_s": cpu1[0] - cpu0[0],
        "cpu_sys_s": cpu1[1] - cpu0[1],
        "cpu_us_per_waiter": ((cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1])) / n * 1e6,
        "supply_reply": supply_reply,
    }


def read_replies(socks: list[socket.socket], timeout_s: float) -> tuple[list, int]:
    """One reply per socket (None if none came), and how many sockets got
    more than one (or more bytes right after it)."""
    n = len(socks)
    replies: list = [None] * n
    bufs = [bytearray() for _ in range(n)]
    extra = set()
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)

    def drain(i, s) -> bool:
        try:
            chunk = s.recv(65536)
        except BlockingIOError:
            return True
        if not chunk:
            sel.unregister(s)
            if replies[i] is None:
                replies[i] = ConnectionError("closed without a reply")
            return False
        bufs[i] += chunk
        if replies[i] is None:
            try:
                replies[i], pos = parse_one(bufs[i])
            except Incomplete:
                return True
            del bufs[i][:pos]
        if bufs[i]:
            extra.add(i)
            bufs[i].clear()
        return True

    try:
        left = n
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                i = key.data
                had = replies[i] is not None
                drain(i, key.fileobj)
                if not had and replies[i] is not None:
                    left -= 1
        # A second answer would arrive right after the first.
        time.sleep(EXTRA_WAIT_S)
        for key, _ in sel.select(timeout=0):
            drain(key.data, key.fileobj)
            if bufs[key.data]:
                extra.add(key.data)
    finally:
        sel.close()
        for s in socks:
            s.setblocking(True)
    return replies, len(extra)


# --------------------------------------------------------------------------
# The two sides


def tb_waiting(c: Conn) -> int:
    return int(c.info("tb")["tb_waiting"])


def side_btake(c: Conn, socks: list[socket.socket]) -> dict:
    n = len(socks)
    failures: list[str] = []
    c.call("DEL", TB_KEY)
    drained = c.call("TB.TAKE", TB_KEY, n, RATE, n)
    if drained[0] != 1 or drained[1] != 0:
        raise RuntimeError(f"drain: {drained!r}")
    base = tb_waiting(c)
    served0 = int(c.info("tb").get("tb_waits_served", 0))
    cmd = encode(("TB.BTAKE", TB_KEY, n, RATE, 1, 0))
    for s in socks:
        s.sendall(cmd)
    wait_until(c, "tb", "tb_waiting", base + n, "TB.BTAKE waiters queueing")
    res = race(c, socks, encode(("TB.REFUND", TB_KEY, n, RATE, n)), timeout_s=60)
    if res["last_ms"] is None:
        failures.append(f"only {res['readable']} of {n} clients answered within 60 s")
    replies, extra = read_replies(socks, timeout_s=30)
    sr = res.pop("supply_reply")
    if not (isinstance(sr, list) and sr[:2] == [1, n]):
        failures.append(f"TB.REFUND replied {sr!r}, expected [1, {n}, ...]")
    good = [r for r in replies if isinstance(r, list) and len(r) == 4 and r[0] == 1 and r[2] == 0]
    if len(good) != n:
        bad = next((r for r in replies if r not in good), None)
        failures.append(f"{n - len(good)} TB.BTAKE clients without an allowed reply (e.g. {bad!r})")
    elif sorted(r[1] for r in good) != list(range(n)):
        failures.append("TB.BTAKE grants' remaining are not N-1 ... 0 each once")
    if extra:
        failures.append(f"{extra} TB.BTAKE clients got more than one reply")
    info = c.info("tb")
    if int(info["tb_waiting"]) != base:
        failures.append(f"tb_waiting {info['tb_waiting']} after the run, expected {base}")
    served = int(info.get("tb_waits_served", 0)) - served0
    if served != n:
        failures.append(f"tb_waits_served grew by {served}, not {n}")
    peek = c.call("TB.PEEK", TB_KEY, n, RATE, 1)
    if peek[1] != 0:
        failures.append(f"bucket holds {peek[1]} tokens after the run, expected 0")
    c.call("DEL", TB_KEY)
    res["failures"] = failures
    return res


def side_blpop(c: Conn, socks: list[socket.socket]) -> dict:
    n = len(socks)
    failures: list[str] = []
    c.call("DEL", LIST_KEY)
    base = int(c.info("clients")["blocked_clients"])
    cmd = encode(("BLPOP", LIST_KEY, 0))
    for s in socks:
        s.sendall(cmd)
    wait_until(c, "clients", "blocked_clients", base + n, "BLPOP clients blocking")
    supply = encode(("RPUSH", LIST_KEY, *range(n)))
    res = race(c, socks, supply, timeout_s=60)
    if res["last_ms"] is None:
        failures.append(f"only {res['readable']} of {n} clients answered within 60 s")
    replies, extra = read_replies(socks, timeout_s=30)
    sr = res.pop("supply_reply")
    if sr != n:
        failures.append(f"RPUSH replied {sr!r}, expected {n}")
    key = LIST_KEY.encode()
    got = [r[1] for r in replies if isinstance(r, list) and len(r) == 2 and r[0] == key]
    if len(got) != n:
        bad = next((r for r in replies if not (isinstance(r, list) and len(r) == 2)), None)
        failures.append(f"{n - len(got)} BLPOP clients without an element (e.g. {bad!r})")
    elif sorted(int(x) for x in got) != list(range(n)):
        failures.append("BLPOP elements are not 0 ... N-1 each once")
    if extra:
        failures.append(f"{extra} BLPOP clients got more than one reply")
    blocked = int(c.info("clients")["blocked_clients"])
    if blocked != base:
        failures.append(f"blocked_clients {blocked} after the run, expected {base}")
    if c.call("EXISTS", LIST_KEY) != 0:
        failures.append("the list still exists after the run")
    res["failures"] = failures
    return res


SIDES = {"TB.BTAKE": side_btake, "BLPOP": side_blpop}


# --------------------------------------------------------------------------
# One server, one config


def summarize(rounds: list[dict], side: str, field: str) -> dict:
    xs = [r[side][field] for r in rounds if r[side][field] is not None]
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def ratio(a, b):
    return a / b if a is not None and b else None


def run_server(name: str, binary: str, module: Path, config: str, n: int, rounds: int,
               warmup: int, log) -> dict:
    limits = ["--maxclients", str(n + 256), "--tcp-backlog", "511"]
    server = Server(binary, module, name, config=[*CONFIGS[config], *limits], tag=f"handoff-{config}")
    out: dict = {"name": name, "binary": binary, "config": config, "n": n}
    try:
        c = Conn(server.port, timeout=60, nodelay=True)
        out["version"] = version_of(c)
        c.call("CONFIG", "SET", "tb.max-waiters", str(max(n, 10_000)))
        out["maxclients"] = int(c.call("CONFIG", "GET", "maxclients")[1])
        if out["maxclients"] < n + 8:
            raise RuntimeError(f"maxclients is {out['maxclients']}, too few for {n} clients")
        out["loadavg_start"] = os.getloadavg()
        t = time.monotonic()
        socks = open_clients(server.port, n, c)
        log(f"{out['version']} ({config}) on port {server.port}: {n} clients connected "
            f"in {time.monotonic() - t:.1f} s")
        measured: list[dict] = []
        failures: list[str] = []
        try:
            for r in range(warmup + rounds):
                order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
                row: dict = {"order": order}
                for side in order:
                    res = SIDES[side](c, socks)
                    res["loadavg_1m"] = os.getloadavg()[0]
                    row[side] = res
                label = "warm-up" if r < warmup else f"round {r + 1 - warmup}"
                for side in order:
                    for f in row[side]["failures"]:
                        failures.append(f"{label}, {side}: {f}")
                        log(f"  FAILURE ({side}): {f}")
                bt, bl = row["TB.BTAKE"], row["BLPOP"]
                log(f"  {label:8} ({' then '.join(order)}): last reply "
                    f"TB.BTAKE {fmt(bt['last_ms'])} ms / BLPOP {fmt(bl['last_ms'])} ms; CPU "
                    f"{fmt(bt['cpu_us_per_waiter'])} / {fmt(bl['cpu_us_per_waiter'])} us/waiter")
                if r >= warmup:
                    measured.append(row)
        finally:
            for s in socks:
                s.close()
        out["rounds"] = measured
        out["failures"] = failures
        out["loadavg_end"] = os.getloadavg()
        med = {side: {f: summarize(measured, side, f)
                      for f in ("last_ms", "first_ms", "cpu_us_per_waiter")} for side in SIDES}
        out["median"] = med
        tr = ratio(med["TB.BTAKE"]["last_ms"]["median"], med["BLPOP"]["last_ms"]["median"])
        cr = ratio(med["TB.BTAKE"]["cpu_us_per_waiter"]["median"],
                   med["BLPOP"]["cpu_us_per_waiter"]["median"])
        out["time_ratio"] = tr
        out["cpu_ratio"] = cr
        out["time_ratio_per_round"] = [ratio(r["TB.BTAKE"]["last_ms"], r["BLPOP"]["last_ms"])
                                       for r in measured]
        out["cpu_ratio_per_round"] = [ratio(r["TB.BTAKE"]["cpu_us_per_waiter"],
                                            r["BLPOP"]["cpu_us_per_waiter"]) for r in measured]
        out["time_met"] = tr is not None and tr <= TARGET_RATIO
        out["cpu_met"] = cr is not None and cr <= TARGET_RATIO
        c.close()
    finally:
        server.stop()
    return out


# --------------------------------------------------------------------------
# Reporting


def met(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def span(s: dict, digits=1) -> str:
    if s["median"] is None:
        return "-"
    return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)}-{fmt(s['max'], digits)})"


def measured(results) -> list[tuple[dict, dict]]:
    """The runs that were measured, each with its medians (an aborted run has
    none, only its failure)."""
    return [(r, r["median"]) for r in results["runs"] if "median" in r]


def main_rows(results):
    head = [
        "server", "AOF", "N", "TB.BTAKE last reply ms", "BLPOP last reply ms",
        "time ratio", f"<= {TARGET_RATIO}x", "TB.BTAKE CPU us/waiter", "BLPOP CPU us/waiter",
        "CPU ratio", f"<= {TARGET_RATIO}x", "load avg",
    ]  # fmt: skip
    rows = [[
        r["version"], "no" if r["config"] == "plain" else "yes (fsync no)", fmt(r["n"]),
        span(m["TB.BTAKE"]["last_ms"]), span(m["BLPOP"]["last_ms"]),
        fmt(r["time_ratio"]) + "x", met(r["time_met"]),
        span(m["TB.BTAKE"]["cpu_us_per_waiter"], 2), span(m["BLPOP"]["cpu_us_per_waiter"], 2),
        fmt(r["cpu_ratio"]) + "x", met(r["cpu_met"]),
        fmt(r["loadavg_start"][0], 1),
    ] for r, m in measured(results)]  # fmt: skip
    return head, rows


def first_rows(results):
    head = ["server", "AOF", "TB.BTAKE first reply ms", "BLPOP first reply ms",
            "time ratios per round", "CPU ratios per round"]
    rows = [[
        r["version"], "no" if r["config"] == "plain" else "yes",
        span(m["TB.BTAKE"]["first_ms"], 2), span(m["BLPOP"]["first_ms"], 2),
        ", ".join(fmt(x) for x in r["time_ratio_per_round"]),
        ", ".join(fmt(x) for x in r["cpu_ratio_per_round"]),
    ] for r, m in measured(results)]  # fmt: skip
    return head, rows


METHOD = """\
Method. Each server is started by the script (loopback, temp dir, module loaded,
`--save ''`, `--maxclients N+256`; once with `appendonly no`, once with `appendonly yes
--appendfsync no`), and N raw sockets connect once and serve both sides. **TB.BTAKE
side**: the key is deleted and drained (`TB.TAKE k N 0.000001 N`), every socket sends
`TB.BTAKE k N 0.000001 1 0`, and once `INFO tb` shows `tb_waiting` = N, one
`TB.REFUND k N 0.000001 N` supplies all N tokens. **BLPOP side**: every socket sends
`BLPOP list 0`, and once `INFO clients` shows `blocked_clients` = N, one
`RPUSH list 0 1 ... N-1` supplies all N elements. **Time to last reply**: from sending the
supply to the moment the last of the N sockets is readable (client clock); the client
waits on an epoll set with one-shot registrations, so while the server serves it only
calls epoll_wait, the same code for both sides. **CPU per served waiter**: `INFO cpu`
user+sys read just before the supply and just after the last reply, / N. Replies are read
and checked afterwards (each client exactly one reply: every TB.BTAKE allowed, remaining
N-1 ... 0 each once; every BLPOP element once; nothing left waiting). One unmeasured
warm-up round (TB.BTAKE first), then the order of the two sides flips every round (BLPOP
first in round 1); figures are medians (min-max) over the rounds, ratios are of the medians
(the per-round ratios are listed too). Target:
TB.BTAKE / BLPOP <= 1.2 for both. The machine is a shared 2-core VM: the client and the
server each have about one core, and the 1-min load average is recorded."""


def write_outputs(results: dict, out: Path):
    (out / "handoff-results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = md_blocks(
        "# TB.BTAKE hand-off race: N waiters on one key, one supply",
        generated_by("handoff_bench.py", results, timing=True) + ".",
        METHOD,
        "## Results",
        md_table(*main_rows(results)),
        "## First reply and per-round ratios",
        md_table(*first_rows(results)),
        "## Servers",
    )
    done = set()
    for r in results["runs"]:
        if r["binary"] not in done:
            done.add(r["binary"])
            lines.append(f"- {r.get('version', r['name'])}: `{r['binary']}`")
    if results["tb_bench_servers"]:
        lines.append(f"- TB_BENCH_SERVERS=`{results['tb_bench_servers']}`")
    lines.append("")
    if results["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s}" for s in results["skipped"]] + [""]
    fails = [(r, f) for r in results["runs"] for f in r.get("failures", [])]
    if fails:
        lines += ["## Correctness failures", ""]
        lines += [f"- {r.get('version', r['name'])} ({r['config']}): {f}" for r, f in fails]
        lines.append("")
    (out / "handoff-results.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waiters", type=int, default=4000, help="N clients blocked on one key (4000)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds, medians over them (3)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (1)")
    ap.add_argument("--configs", default="plain,aof",
                    help="comma list of plain (appendonly no), aof (appendonly yes, fsync no)")
    ap.add_argument("--servers", help="comma list: only these servers (names such as redis, "
                    "valkey-9.1, or a substring of a TB_BENCH_SERVERS path)")
    ap.add_argument("--module", default=os.environ.get("TB_MODULE", str(ROOT / "target/release/libredis_tb.so")))
    ap.add_argument("--out", default=str(RESULTS_DIR), help="where handoff-results.md/.json go")
    args = ap.parse_args()  # fmt: skip

    module = built_module(args.module)
    configs = [x for x in args.configs.split(",") if x]
    for cfg in configs:
        if cfg not in CONFIGS:
            raise SystemExit(f"unknown config {cfg!r}; choose from {', '.join(CONFIGS)}")
    n = args.waiters
    nofile = raise_nofile(n + 256)
    if nofile < n + 64:
        raise SystemExit(f"RLIMIT_NOFILE {nofile} is too low for {n} clients")

    servers, skipped = discover_servers(args.servers)
    for note in skipped:
        log(note)
    results = {
        **run_head(git_rev("src", "bench/handoff_bench.py", "Cargo.toml", "Cargo.lock"), module),
        "loadavg_start": os.getloadavg(),
        "nofile": nofile,
        "waiters": n,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "target_ratio": TARGET_RATIO,
        "tb_bench_servers": os.environ.get("TB_BENCH_SERVERS", ""),
        "skipped": skipped,
        "runs": [],
    }
    failed = False
    with timed_run(results):
        for name, binary in servers:
            for cfg in configs:
                try:
                    run = run_server(name, binary, module, cfg, n, args.rounds, args.warmup, log)
                except ServerStartError as e:
                    # A server that does not start (or refuses the module) is a
                    # note, not a failure of the module.
                    log(f"{name} ({cfg}): not measured: {e}")
                    results["skipped"].append(f"{name} ({cfg}): did not start, see its log")
                    continue
                except (RuntimeError, OSError, ReplyError) as e:
                    log(f"{name} ({cfg}): FAILURE: {e}")
                    results["runs"].append({"name": name, "binary": binary, "config": cfg,
                                            "n": n, "failures": [f"aborted: {e}"]})
                    failed = True
                    continue
                results["runs"].append(run)
                failed |= bool(run["failures"])
                log(f"  => time {fmt(run['time_ratio'])}x ({met(run['time_met'])}), "
                    f"CPU {fmt(run['cpu_ratio'])}x ({met(run['cpu_met'])})")
    return finish(results, args.out, write_outputs, ("handoff-results.md", "handoff-results.json"), failed,
                  tables=(main_rows, first_rows), right=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

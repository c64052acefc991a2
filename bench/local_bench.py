#!/usr/bin/env python3
"""The client libraries' in-process answers against one GET round trip.

docs/clients.md: while Redis is unreachable a limiter with the local
limiter answers takes in process, and with the denial cache a key denied
until T is answered in process until T. Both exist to cost next to nothing
beside a trip to Redis. Each library carries a small program that measures,
in one run, with its own Redis client:

* one plain GET round trip to a server on 127.0.0.1 (the baseline);
* a take answered by the local limiter (its client points at a closed port,
  so the limiter is in an outage and sends nothing);
* a denied take answered from the denial cache (the bucket emptied first).

  Python  clients/python/bench/local_bench.py (the venv of
          bench/middleware_bench.py, .cache/mw-bench/venv, with the library
          installed from the checkout)
  Node    clients/node/bench/local_bench.js (ioredis from the npm install of
          bench/middleware_bench.py, .cache/mw-bench/node)
  Rust    clients/rust/examples/local_bench.rs (cargo run --release)

Each prints one JSON line: {"library", "get_round_trip_us", "local_take_us",
"cached_denial_us"}. This script starts one server with the module (Redis
from PATH, or TB_SERVER), runs each program --reps times, interleaved, and
takes the ratios within each run, medians over the runs. Targets: a local
take and a cached denial each at most 0.05x a GET round trip. A library
that cannot be set up is reported as skipped; a miss is recorded, not fatal.

Results: bench/results/local-results.md and .json. Python 3.11 standard
library; helpers from bench/harness.py and bench/middleware_bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import harness  # noqa: E402
import middleware_bench as mw  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
TARGET_RATIO = 0.05
RUST_TARGET = ROOT / ".cache" / "mw-bench" / "rust-target"
MEASURES = (("local_take_us", "local take"), ("cached_denial_us", "cached denial"))


def programs() -> tuple[dict[str, list], dict[str, str]]:
    """The command line of each library's program, and why any is skipped."""
    commands, skipped = {}, {}
    why = mw.setup_python()
    if why is None:
        commands["python"] = [str(mw.VENV / "bin" / "python"), str(ROOT / "clients/python/bench/local_bench.py")]
    else:
        skipped["python"] = why
    why = mw.setup_node()
    if why is None:
        commands["node"] = ["node", str(ROOT / "clients/node/bench/local_bench.js")]
    else:
        skipped["node"] = why
    if shutil.which("cargo"):
        manifest = ROOT / "clients/rust/Cargo.toml"
        env = dict(os.environ, CARGO_TARGET_DIR=str(RUST_TARGET))
        build = subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "local_bench",
                                "--manifest-path", str(manifest)], env=env, capture_output=True, text=True)  # fmt: skip
        if build.returncode == 0:
            commands["rust"] = [str(RUST_TARGET / "release" / "examples" / "local_bench")]
        else:
            skipped["rust"] = "cargo build --example local_bench failed: " + build.stderr.strip()[-400:]
    else:
        skipped["rust"] = "cargo not found"
    return commands, skipped


def run_once(command: list, port: int) -> dict:
    env = dict(os.environ, NODE_PATH=str(mw.NODE_DIR / "node_modules"))
    done = subprocess.run([*command, "--port", str(port)], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        raise RuntimeError(f"{' '.join(command)} printed {len(lines)} lines, not one JSON line")
    figures = json.loads(lines[0])
    for field in ("get_round_trip_us", *(m for m, _ in MEASURES)):
        if not isinstance(figures.get(field), (int, float)) or figures[field] <= 0:
            raise RuntimeError(f"{' '.join(command)}: {field} missing or not positive in {lines[0]}")
    return figures


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", 3)))
    ap.add_argument("--module", default=os.environ.get("TB_MODULE", str(ROOT / "target/release/libredis_tb.so")))
    ap.add_argument("--out", default=str(RESULTS_DIR), help="where local-results.md/.json go")
    args = ap.parse_args()
    module = harness.built_module(args.module)
    results = {
        **harness.run_head(bench.git_rev(), module),
        "loadavg_start": os.getloadavg(),
        "reps": args.reps,
        "target_ratio": TARGET_RATIO,
        "skipped": {},
        "failures": [],
        "libraries": {},
    }
    with harness.timed_run(results):
        commands, results["skipped"] = programs()
        for library, why in results["skipped"].items():
            harness.log(f"{library}: skipped: {why}")
        server = harness.Server(os.environ.get("TB_SERVER", "redis-server"), module, "local")
        results["server"] = harness.version_of(server.conn())
        runs: dict[str, list[dict]] = {library: [] for library in commands}
        for rep in range(args.reps):
            for library, command in commands.items():
                try:
                    figures = run_once(command, server.port)
                except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
                    results["failures"].append(f"{library}: {e}")
                    harness.log(f"{library}: FAILURE: {e}")
                    continue
                runs[library].append(figures)
                harness.log(f"  [rep {rep + 1}/{args.reps}] {library:<6} GET {figures['get_round_trip_us']:8.2f} us, "
                            + ", ".join(f"{label} {figures[m]:.3f} us" for m, label in MEASURES))  # fmt: skip
        for library, figures in runs.items():
            if not figures:
                continue
            entry = {"runs": figures, "get_round_trip_us": summary([f["get_round_trip_us"] for f in figures])}
            for measure, label in MEASURES:
                ratios = [f[measure] / f["get_round_trip_us"] for f in figures]
                entry[measure] = summary([f[measure] for f in figures])
                entry[measure.replace("_us", "_ratio")] = summary(ratios)
                met = statistics.median(ratios) <= TARGET_RATIO
                harness.log(f"  => {library} {label}: {statistics.median(ratios):.4f}x a GET "
                            f"({'MET' if met else 'MISSED'}, target <= {TARGET_RATIO}x)")
            results["libraries"][library] = entry
    return harness.finish(results, args.out, write_outputs, ("local-results.md", "local-results.json"),
                          bool(results["failures"]), tables=(target_rows,))  # fmt: skip


def target_rows(results: dict):
    head = ["", "library", "measure", "median", "range", "limit", "us/call", "GET us"]
    rows = []
    for library, entry in results["libraries"].items():
        for measure, label in MEASURES:
            ratio = entry[measure.replace("_us", "_ratio")]
            rows.append([
                "met" if ratio["median"] <= TARGET_RATIO else "MISSED", library, f"{label} / one GET round trip",
                f"{ratio['median']:.4f}x", f"{ratio['min']:.4f}-{ratio['max']:.4f}", f"<= {TARGET_RATIO}x",
                f"{entry[measure]['median']:.3f}", f"{entry['get_round_trip_us']['median']:.2f}",
            ])  # fmt: skip
    return head, rows


def write_outputs(results: dict, out_dir: Path) -> None:
    (out_dir / "local-results.json").write_text(json.dumps(results, indent=2) + "\n")
    head, rows = target_rows(results)
    table = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                      + ["| " + " | ".join(row) + " |" for row in rows])  # fmt: skip
    notes = [f"- {library}: skipped: {why}" for library, why in results["skipped"].items()]
    notes += [f"- FAILURE: {failure}" for failure in results["failures"]]
    lines = harness.md_blocks(
        "# The libraries' in-process answers against one GET round trip",
        harness.generated_by("local_bench.py", results, timing=True) + f"; server {results.get('server', '?')}. "
        "Each library's own program (bench/local_bench.py lists them) times, with its own Redis client, one "
        "GET round trip to the server, a take answered by the local limiter (Redis unreachable) and a denied "
        "take answered from the denial cache; ratios within each run, medians over "
        f"{results['reps']} runs. Target: both at most {TARGET_RATIO}x a GET (docs/benchmarks.md).",
        table,
        *(["\n".join(notes)] if notes else []),
    )
    (out_dir / "local-results.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())

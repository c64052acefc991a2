#!/usr/bin/env python3
"""`make bench`, last part: what the limiter middleware costs per request.

For each framework (uvicorn/Starlette, gunicorn/Flask, Express, Fastify,
axum) one app (bench/middleware/) serves four routes:

  /bare/x    "ok", no middleware: the framework's own cost
  /get/x     one plain GET to the same Redis from the handler, then "ok":
             the cost of one round trip through the app's usual client
  /module/x  "ok" behind the library's limiter middleware, module backend
  /lua/x     the same on the Lua backend (FUNCTION library)

Each route is its own sub-app (Starlette Mount, Flask app under werkzeug's
dispatcher, Fastify context, axum nested Router; Express: route-level
middleware), so the four differ only by the handler's GET or the middleware.

The policy never denies (capacity and rate 1e9): the allow path, the one every
request of a healthy service takes. A load generator of our own (below: one
HTTP/1.1 keep-alive connection, one request at a time) times each request.
Routes are interleaved: within a round the four take turns in blocks of 100
requests, in a rotating order, so a slow phase of a shared machine hits them
alike; each round gives one median per route, and every figure is the median
over the rounds.

    limiter overhead = t(/module/x) - t(/bare/x)
    GET round trip   = t(/get/x) - t(/bare/x)
    ratio            = limiter overhead / GET round trip    (target <= 1.5)

The same ratio is also computed from CPU time (the app's processes and the
Redis server's, /proc/<pid>/task/*/schedstat, per request): time spent
waiting for a CPU on a loaded machine is not in it.

The ratio is computed within each round, against the baselines of the same
round, then summarised by its median (and min-max over the rounds).

Installs on demand, outside git: a venv (.cache/mw-bench/venv, from
bench/middleware/requirements.txt, plus clients/python from the checkout), a
node_modules (.cache/mw-bench/node, bench/middleware/package.json plus the
`npm pack` tarball of clients/node) and the axum app (cargo, release,
.cache/mw-bench/axum-target). A framework whose install or start fails is
reported as skipped, with the reason; that is not a failure.

Writes bench/results/middleware-results.json and bench/results/middleware-results.md.
Exits 1 only when a route answered wrongly (not 200, no RateLimit header
behind the limiter, or the backend's command not seen by the server).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import RESULTS_DIR, ROOT, Server, commandstats, git_rev, md_table

APPS = ROOT / "bench" / "middleware"
CACHE = ROOT / ".cache" / "mw-bench"
VENV = CACHE / "venv"
NODE_DIR = CACHE / "node"
AXUM_TARGET = CACHE / "axum-target"
ROUTES = ["bare", "get", "module", "lua"]
# Every route one level down, so that each framework can give the four the same
# structure (a sub-app or sub-router each), the middleware being the only difference.
PATHS = {"bare": "/bare/x", "get": "/get/x", "module": "/module/x", "lua": "/lua/x"}
TARGET_RATIO = 1.5
BLOCK = 100  # requests to one route before the next route's turn


def log(msg: str):
    print(f"middleware-bench: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Ports and processes


def free_port() -> int:
    """A free loopback port in 20000-32000 (outside the ephemeral range, so
    no outgoing connection takes it between the check and the bind)."""
    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def redis_server(binary: str, module: Path) -> Server:
    """The Redis the apps talk to: no persistence, module loaded, on a port
    from this script's free_port, as the apps' own are: outside the ephemeral
    range, where the many connections of a run could take it first."""
    return Server(binary, module, Path(binary).name, tag="mw-bench", port=free_port)


def command_calls(server: Server) -> dict[str, int]:
    """Calls per command so far (INFO commandstats)."""
    with server.conn() as c:
        return {name: int(stats["calls"]) for name, stats in commandstats(c).items()}


def group_pids(pgid: int) -> list[int]:
    """The processes of a process group (an app with its workers: gunicorn's
    master and worker)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def cpu_ns(pids: list[int]) -> int:
    """CPU time the processes' threads have run so far, in ns
    (/proc/<pid>/task/<tid>/schedstat: exact, not tick-sampled)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(task.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


# --------------------------------------------------------------------------
# The load generator: one keep-alive connection, one request at a time


class HttpConn:
    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        self.sock.close()

    def request(self, path: str) -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path.encode())
        return self.read_response()

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    self._fill()
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    self._fill()
                body += self.buf[:size]
                self.buf = self.buf[size + 2 :]
                if size == 0:
                    break
        else:
            size = int(headers.get("content-length", "0"))
            while len(self.buf) < size:
                self._fill()
            body, self.buf = self.buf[:size], self.buf[size:]
        if headers.get("connection", "").lower() == "close":
            raise RuntimeError("the server closed the connection (no keep-alive)")
        return status, headers, body

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError("connection closed by the server")
        self.buf += data

    def time_requests(self, path: str, n: int) -> list[float]:
        """n requests on this connection; each one's time in microseconds.
        Checks only the status line's code (the full check is `check_routes`)."""
        request = b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path.encode()
        sock, clock = self.sock, time.perf_counter_ns
        times = []
        for _ in range(n):
            t0 = clock()
            sock.sendall(request)
            status, _, _ = self.read_response()
            times.append((clock() - t0) / 1000)
            if status != 200:
                raise RuntimeError(f"{path}: HTTP {status}")
        return times


# --------------------------------------------------------------------------
# Installs (each returns None when ready, else why the framework is skipped)


def run_quiet(argv, cwd=None, env=None, timeout=900) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        tail = done.stdout.decode(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n  " + "\n  ".join(tail))


def setup_python() -> str | None:
    py = VENV / "bin" / "python"
    reqs = APPS / "requirements.txt"
    try:
        if not py.exists():
            shutil.rmtree(VENV, ignore_errors=True)
            if subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True).returncode != 0:
                # Debian's python3 has no ensurepip until python3-venv is installed.
                shutil.rmtree(VENV, ignore_errors=True)
                log("installing python3-venv (apt-get)")
                run_quiet(["apt-get", "update", "-qq"])
                run_quiet(["apt-get", "install", "-y", "-qq", "python3-venv"])
                run_quiet([sys.executable, "-m", "venv", str(VENV)])
        stamp = VENV / ".installed-requirements"
        if not stamp.exists() or stamp.read_bytes() != reqs.read_bytes():
            log(f"pip install -r {reqs.relative_to(ROOT)} into {VENV.relative_to(ROOT)}")
            run_quiet([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", reqs])
            stamp.write_bytes(reqs.read_bytes())
        speedups = APPS / "requirements-speedups.txt"
        stamp = VENV / ".installed-speedups"
        if not stamp.exists() or stamp.read_bytes() != speedups.read_bytes():
            try:
                run_quiet([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", speedups])
                stamp.write_bytes(speedups.read_bytes())
            except Exception as e:  # noqa: BLE001 - uvicorn then runs on asyncio and h11
                log(f"uvloop/httptools not installed, uvicorn runs on asyncio and h11: {e}")
        # The client itself, every run, from the checkout (not editable: what users get).
        with tempfile.TemporaryDirectory(prefix="tb-mw-py-") as tmp:
            src = Path(tmp) / "python"
            shutil.copytree(ROOT / "clients" / "python", src, symlinks=False,
                            ignore=shutil.ignore_patterns(".venv*", "build", "*.egg-info", "__pycache__"))
            run_quiet([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                       "--force-reinstall", "--no-deps", src])  # fmt: skip
    except Exception as e:  # noqa: BLE001 - reported as the reason for skipping
        return f"Python install failed: {e}"
    return None


def setup_node() -> str | None:
    try:
        if not shutil.which("node") or not shutil.which("npm"):
            return "node/npm not found (make deps installs them)"
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        for old in NODE_DIR.glob("redis-tb-*.tgz"):
            old.unlink()
        log("npm pack clients/node; npm install express, fastify, ioredis")
        out = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(NODE_DIR), str(ROOT / "clients" / "node")],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        if out.returncode != 0:
            return f"npm pack clients/node failed: {out.stderr.strip()[-500:]}"
        tarball = out.stdout.strip().splitlines()[-1]
        spec = json.loads((APPS / "package.json").read_text())
        spec["dependencies"]["redis-tb"] = f"file:{tarball}"
        (NODE_DIR / "package.json").write_text(json.dumps(spec, indent=2) + "\n")
        # The tarball changes with every run: install it afresh, the rest from npm's cache.
        shutil.rmtree(NODE_DIR / "node_modules" / "redis-tb", ignore_errors=True)
        run_quiet(["npm", "install", "--no-audit", "--no-fund", "--no-package-lock", "--loglevel=error"], cwd=NODE_DIR)
    except Exception as e:  # noqa: BLE001
        return f"Node install failed: {e}"
    return None


def setup_axum() -> str | None:
    if not shutil.which("cargo"):
        return "cargo not found"
    log("cargo build --release bench/middleware/axum")
    env = dict(os.environ, CARGO_TARGET_DIR=str(AXUM_TARGET))
    try:
        run_quiet(["cargo", "build", "--release", "--quiet", "--manifest-path", APPS / "axum" / "Cargo.toml"], env=env)
    except Exception as e:  # noqa: BLE001
        return f"cargo build failed: {e}"
    return None


# --------------------------------------------------------------------------
# Frameworks


def frameworks() -> list[dict]:
    py = str(VENV / "bin" / "python")
    speedups = (VENV / ".installed-speedups").exists()
    loop, http = ("uvloop", "httptools") if speedups else ("asyncio", "h11")
    node_env = {"NODE_PATH": str(NODE_DIR / "node_modules")}
    return [
        {"name": "uvicorn/Starlette", "setup": "python",
         "argv": [py, "-m", "uvicorn", "asgi_app:app", "--host", "127.0.0.1", "--port", "{port}",
                  "--workers", "1", "--loop", loop, "--http", http,
                  "--log-level", "warning", "--no-access-log"],
         "server": f"uvicorn 1 worker, {loop}, {http}; redis.asyncio",
         "packages": ["starlette", "uvicorn", "uvloop", "httptools", "redis", "redis-tb"]},
        {"name": "gunicorn/Flask", "setup": "python",
         "argv": [py, "-m", "gunicorn", "--workers", "1", "--worker-class", "gthread", "--threads", "4",
                  "--keep-alive", "60", "--bind", "127.0.0.1:{port}", "--log-level", "warning", "wsgi_app:app"],
         "server": "gunicorn 1 gthread worker, 4 threads; redis (sync)",
         "packages": ["flask", "werkzeug", "gunicorn", "redis", "redis-tb"]},
        {"name": "Express", "setup": "node", "env": node_env,
         "argv": ["node", "node_app.js", "express"], "server": "node, 1 process; ioredis",
         "packages": ["node", "express", "ioredis", "redis-tb"]},
        {"name": "Fastify", "setup": "node", "env": node_env,
         "argv": ["node", "node_app.js", "fastify"], "server": "node, 1 process; ioredis",
         "packages": ["node", "fastify", "ioredis", "redis-tb"]},
        {"name": "axum", "setup": "axum",
         "argv": [str(AXUM_TARGET / "release" / "tb-mw-bench-axum")],
         "server": "tokio multi-thread runtime; redis crate MultiplexedConnection"},
    ]  # fmt: skip


def versions(setup: str) -> dict[str, str]:
    try:
        if setup == "python":
            out = subprocess.run([VENV / "bin" / "python", "-m", "pip", "list", "--format=json"],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            want = {"starlette", "uvicorn", "uvloop", "httptools", "flask", "werkzeug", "gunicorn", "redis", "redis-tb"}
            return {p["name"]: p["version"] for p in json.loads(out.stdout) if p["name"].lower() in want}
        if setup == "node":
            found = {"node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()}
            for name in ("express", "fastify", "ioredis", "redis-tb"):
                pkg = NODE_DIR / "node_modules" / name / "package.json"
                if pkg.exists():
                    found[name] = json.loads(pkg.read_text())["version"]
            return found
        if setup == "axum":
            lock = (APPS / "axum" / "Cargo.lock").read_text()
            found = {}
            for block in lock.split("[[package]]"):
                fields = dict(line.split(" = ", 1) for line in block.strip().splitlines() if " = " in line)
                name = fields.get("name", "").strip('"')
                if name in ("axum", "tokio", "hyper", "redis", "redis-tb-client"):
                    found[name] = fields["version"].strip('"')
            rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.split()
            found["rustc"] = rustc[1] if len(rustc) > 1 else "?"
            return found
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    return {}


class App:
    def __init__(self, fw: dict, redis_url: str):
        self.dir = Path(tempfile.mkdtemp(prefix="tb-mw-app-"))
        self.log_path = self.dir / "app.log"
        last = ""
        for _ in range(3):
            self.port = free_port()
            env = dict(os.environ, REDIS_URL=redis_url, PORT=str(self.port), PYTHONDONTWRITEBYTECODE="1",
                       **fw.get("env", {}))  # fmt: skip
            argv = [a.replace("{port}", str(self.port)) for a in fw["argv"]]
            with open(self.log_path, "wb") as out:
                self.proc = subprocess.Popen(argv, cwd=APPS, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)  # fmt: skip
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    conn = HttpConn(self.port, timeout=2)
                    try:
                        if conn.request(PATHS["bare"])[0] == 200:
                            return
                    finally:
                        conn.close()
                except (OSError, RuntimeError, ValueError, IndexError):
                    time.sleep(0.1)
            last = self.log_path.read_text(errors="replace")[-2000:]
            self.stop()
        raise RuntimeError(f"the app did not start:\n{last}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def check_routes(port: int) -> list[str]:
    """Each route answers 200 "ok"; the limited ones carry the draft-11 headers."""
    problems = []
    conn = HttpConn(port)
    try:
        for route in ROUTES:
            status, headers, body = conn.request(PATHS[route])
            if status != 200 or body != b"ok":
                problems.append(f"{PATHS[route]}: HTTP {status} {body[:80]!r}")
            limited = route in ("module", "lua")
            if limited != ("ratelimit" in headers):
                problems.append(f"{PATHS[route]}: RateLimit header {'missing' if limited else 'present'}")
    finally:
        conn.close()
    return problems


def bench_framework(fw: dict, server: Server, requests: int, rounds: int, warmup: int) -> dict:
    app = App(fw, f"redis://127.0.0.1:{server.port}/0")
    try:
        problems = check_routes(app.port)
        conn = HttpConn(app.port)
        try:
            for route in ROUTES:
                conn.time_requests(PATHS[route], warmup)
            before = command_calls(server)
            app_pids, redis_pids = group_pids(app.proc.pid), [server.proc.pid]
            per_round = []
            blocks = max(1, requests // BLOCK)
            for r in range(rounds):
                # Blocks of BLOCK requests per route, the routes taking turns in a rotating
                # order: a slow spell of the shared machine hits the four routes alike.
                samples = {route: [] for route in ROUTES}
                app_ns = dict.fromkeys(ROUTES, 0)
                redis_ns = dict.fromkeys(ROUTES, 0)
                for b in range(blocks):
                    shift = (r + b) % len(ROUTES)
                    for route in ROUTES[shift:] + ROUTES[:shift]:
                        a0, s0 = cpu_ns(app_pids), cpu_ns(redis_pids)
                        samples[route] += conn.time_requests(PATHS[route], requests // blocks)
                        app_ns[route] += cpu_ns(app_pids) - a0
                        redis_ns[route] += cpu_ns(redis_pids) - s0
                done = blocks * (requests // blocks)
                row = {route: statistics.median(xs) for route, xs in samples.items()}
                row["cpu_app"] = {route: app_ns[route] / done / 1000 for route in ROUTES}
                row["cpu_redis"] = {route: redis_ns[route] / done / 1000 for route in ROUTES}
                per_round.append(row)
            after = command_calls(server)
        finally:
            conn.close()
    finally:
        app.stop()
    # The backends really ran: one TB.TAKE per /module request, one FCALL per /lua one.
    n = requests * rounds
    for route, cmd in (("module", "tb.take"), ("lua", "fcall"), ("get", "get")):
        seen = after.get(cmd, 0) - before.get(cmd, 0)
        if seen < n:
            problems.append(f"{PATHS[route]}: the server saw {seen} {cmd.upper()} for {n} requests")
    return {"per_round": per_round, "problems": problems}


def breakdowns(setups: dict, server: Server, n: int, rounds: int) -> dict:
    """Each library's own cost without HTTP (bench/middleware/breakdown.*):
    one GET against one `take` on the same connection kind, and the
    middleware's decision called directly. Says whether the excess over one
    GET is the library's call or the framework glue around it."""
    runs = {
        "python": ([str(VENV / "bin" / "python"), "breakdown.py"], {}),
        "node": (["node", "breakdown.js"], {"NODE_PATH": str(NODE_DIR / "node_modules")}),
        "axum": ([str(AXUM_TARGET / "release" / "tb-mw-bench-axum"), "breakdown"],
                 {"REDIS_URL": f"redis://127.0.0.1:{server.port}/0", "PORT": "0"}),
    }  # fmt: skip
    out = {}
    for setup, (argv, env) in runs.items():
        if setup not in setups or setups[setup]:
            continue
        argv = argv + ([str(server.port)] if setup != "axum" else []) + [str(n), str(rounds)]
        try:
            done = subprocess.run(argv, cwd=APPS, env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip()[-500:])
            out[setup] = json.loads(done.stdout.strip().splitlines()[-1])
        except Exception as e:  # noqa: BLE001 - informative only
            log(f"breakdown {setup}: {e}")
    return out


def summarise(per_round: list[dict]) -> dict:
    def med(xs):
        return statistics.median(xs)

    out = {route: med([r[route] for r in per_round]) for route in ROUTES}
    ratios = {}
    for backend in ("module", "lua"):
        xs = [(r[backend] - r["bare"]) / (r["get"] - r["bare"]) for r in per_round if r["get"] > r["bare"]]
        ratios[backend] = {"median": med(xs), "min": min(xs), "max": max(xs)} if xs else None
    out["get_overhead"] = med([r["get"] - r["bare"] for r in per_round])
    out["module_overhead"] = med([r["module"] - r["bare"] for r in per_round])
    out["lua_overhead"] = med([r["lua"] - r["bare"] for r in per_round])
    out["ratio"] = ratios
    out["target_met"] = ratios["module"] is not None and ratios["module"]["median"] <= TARGET_RATIO
    # CPU per request, the app's and the server's: what a request costs whatever
    # the machine's load (waiting for a CPU is not counted).
    cpu = {}
    for route in ROUTES:
        cpu[route] = med([r["cpu_app"][route] + r["cpu_redis"][route] for r in per_round])
        cpu[f"{route}_app"] = med([r["cpu_app"][route] for r in per_round])
        cpu[f"{route}_redis"] = med([r["cpu_redis"][route] for r in per_round])
    for backend in ("module", "lua"):
        xs = []
        for r in per_round:
            total = {route: r["cpu_app"][route] + r["cpu_redis"][route] for route in ROUTES}
            if total["get"] > total["bare"]:
                xs.append((total[backend] - total["bare"]) / (total["get"] - total["bare"]))
        cpu[f"ratio_{backend}"] = {"median": med(xs), "min": min(xs), "max": max(xs)} if xs else None
    cpu["target_met"] = cpu["ratio_module"] is not None and cpu["ratio_module"]["median"] <= TARGET_RATIO
    out["cpu"] = cpu
    return out


# --------------------------------------------------------------------------
# Output


def f1(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def ratio_text(r) -> str:
    return "-" if r is None else f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def table(results: dict) -> tuple[list[str], list[list[str]]]:
    head = ["framework", "bare µs", "+GET µs", "+limiter µs (module)", "ratio module/GET",
            "+limiter µs (Lua)", "ratio Lua/GET", "target <= 1.5x"]  # fmt: skip
    rows = []
    for name, res in results["frameworks"].items():
        if "skipped" in res:
            rows.append([name, "skipped", "", "", "", "", "", ""])
            continue
        s = res["summary"]
        rows.append([name, f1(s["bare"]), f1(s["get_overhead"]), f1(s["module_overhead"]), ratio_text(s["ratio"]["module"]),
                     f1(s["lua_overhead"]), ratio_text(s["ratio"]["lua"]), "met" if s["target_met"] else "MISSED"])  # fmt: skip
    return head, rows


def cpu_table(results: dict) -> tuple[list[str], list[list[str]]]:
    head = ["framework", "bare CPU µs", "+GET CPU µs", "+limiter CPU µs (module)", "ratio module/GET",
            "+limiter CPU µs (Lua)", "ratio Lua/GET", "target <= 1.5x"]  # fmt: skip
    rows = []
    for name, res in results["frameworks"].items():
        if "summary" not in res:
            continue
        c = res["summary"]["cpu"]

        def plus(route, c=c):
            return f"{c[route] - c['bare']:.1f} (app {c[route + '_app'] - c['bare_app']:.1f}, " \
                   f"server {c[route + '_redis'] - c['bare_redis']:.1f})"  # fmt: skip

        rows.append([name, f1(c["bare"]), plus("get"), plus("module"), ratio_text(c["ratio_module"]),
                     plus("lua"), ratio_text(c["ratio_lua"]), "met" if c["target_met"] else "MISSED"])  # fmt: skip
    return head, rows


def markdown(results: dict) -> str:
    meta = results["meta"]
    head, rows = table(results)
    lines = [
        "# Middleware overhead per request (bench/middleware_bench.py)",
        "",
        f"{meta['date']}, git {meta['git']}, {meta['server']}, {meta['cpus']} CPUs, "
        f"load average {meta['loadavg_before']} before and {meta['loadavg_after']} after. "
        f"One keep-alive connection, one request at a time; {meta['requests']} requests per route "
        f"per round, the routes taking turns in blocks of {BLOCK}, {meta['rounds']} rounds (after "
        f"{meta['warmup']} warm-up requests per route); "
        "medians of the per-round medians. `+GET` is `/get/x - /bare/x`, one plain GET round trip from "
        "the handler; `+limiter` is `/module/x - /bare/x` (or `/lua/x`), the middleware on the allow "
        "path; the ratio is computed per round (median, min-max over the rounds). Target: the "
        "module ratio <= 1.5.",
        "",
        md_table(head, rows),
    ]
    head, rows = cpu_table(results)
    if rows:
        lines += [
            "",
            "The same requests in CPU time: the app's processes (all threads) and the Redis "
            "server's, from `/proc/<pid>/task/*/schedstat`, per request, medians over the rounds. "
            "Time spent waiting for a CPU is not in it, so these hold on a loaded machine where "
            "the latencies above scatter.",
            "",
            md_table(head, rows),
        ]
    lines += ["", "| framework | server and client | versions |", "|---|---|---|"]
    for name, res in results["frameworks"].items():
        if "skipped" in res:
            lines.append(f"| {name} | skipped: {res['skipped'].splitlines()[0]} | |")
        else:
            v = ", ".join(f"{k} {x}" for k, x in res["versions"].items())
            lines.append(f"| {name} | {res['server']} | {v} |")
    lines.append("")
    lines.append("Per-request medians in µs (`/bare/x`, `/get/x`, `/module/x`, `/lua/x`):")
    lines.append("")
    for name, res in results["frameworks"].items():
        if "summary" in res:
            s = res["summary"]
            lines.append(f"- {name}: {f1(s['bare'])}, {f1(s['get'])}, {f1(s['module'])}, {f1(s['lua'])}")
    bd = results.get("breakdown") or {}
    if bd:
        lines += [
            "",
            "## Without HTTP: one GET against one take",
            "",
            "Each library in process, on the connection kind its middleware uses, against the same "
            "server (bench/middleware/breakdown.py, breakdown.js, the axum binary's `breakdown` mode): "
            "µs per call, sequential; `decision` is the middleware's own work called directly (Python: "
            "the WSGI/ASGI middleware around an app that does nothing; Node: `limiterCore`'s decide, "
            "what the Express middleware and the Fastify hook run).",
            "",
            "| library | GET | take | take / GET | decision | decision / GET |",
            "|---|---|---|---|---|---|",
        ]
        rows = []
        if "python" in bd:
            rows.append(("Python sync (redis.Redis)", bd["python"]["sync"]))
            rows.append(("Python async (redis.asyncio, uvloop if installed)", bd["python"]["async"]))
        if "node" in bd:
            rows.append(("Node (ioredis)", bd["node"]))
        if "axum" in bd:
            rows.append(("Rust (MultiplexedConnection)", bd["axum"]))
        for label, r in rows:
            dec = r.get("middleware")
            dec_ratio = "-" if dec is None else f"{dec / r['get']:.2f}"
            lines.append(f"| {label} | {f1(r['get'])} | {f1(r['take'])} | {r['take'] / r['get']:.2f} | "
                         f"{f1(dec)} | {dec_ratio} |")  # fmt: skip
        extra = []
        if "python" in bd:
            extra.append(f"Python: `bucket_key()` {bd['python']['sync']['cpu_bucket_key']:.2f} µs, "
                         f"`Decision.headers()` {bd['python']['sync']['cpu_headers']:.2f} µs")  # fmt: skip
        if "node" in bd:
            extra.append(f"Node: `headers()` {bd['node']['cpu_headers']:.2f} µs")
        if extra:
            lines += ["", "CPU alone, no I/O: " + "; ".join(extra) + "."]
        wf = bd.get("python", {}).get("async", {}).get("get_wait_for")
        if wf:
            a = bd["python"]["async"]
            lines += ["", f"Python async, one GET: {a['get']:.1f} µs alone, {a['get_timeout']:.1f} µs inside "
                          f"`asyncio.timeout` (how AsyncRateLimiter bounds each command on Python 3.11+), "
                          f"{wf:.1f} µs inside `asyncio.wait_for` (a task per call: what it used before)."]  # fmt: skip
        prof = bd.get("python", {}).get("profile_wsgi")
        if prof:
            lines += ["", "Python, cProfile over the WSGI middleware (own time per request, under the profiler):", "",
                      "| function | µs | calls |", "|---|---|---|"]  # fmt: skip
            lines += [f"| `{r['function']}` | {r['own_us_per_request']:.1f} | {r['calls_per_request']:g} |" for r in prof]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="requests per route per round (default 2000)")
    p.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    p.add_argument("--warmup", type=int, default=300, help="warm-up requests per route (default 300)")
    p.add_argument("--quick", action="store_true", help="300 requests x 3 rounds, for a smoke run")
    p.add_argument("--no-breakdown", action="store_true", help="skip the in-process GET/take breakdown")
    p.add_argument("--only", default="", help="comma-separated framework names (e.g. axum,Express)")
    p.add_argument("--out", default=str(RESULTS_DIR / "middleware-results"),
                   help="output path without extension (default bench/results/middleware-results)")
    args = p.parse_args()
    if args.quick:
        args.requests, args.rounds, args.warmup = 300, 3, 100

    module = Path(os.environ.get("TB_MODULE") or ROOT / "target" / "release" / "libredis_tb.so")
    binary = os.environ.get("TB_SERVER", "redis-server")
    if not module.exists():
        log(f"{module} does not exist (cargo build --release)")
        return 1
    fws = frameworks()
    if args.only:
        wanted = {w.strip().lower() for w in args.only.split(",")}
        fws = [f for f in fws if f["name"].lower() in wanted or any(w in f["name"].lower() for w in wanted)]
    setups = {}
    for setup, fn in (("python", setup_python), ("node", setup_node), ("axum", setup_axum)):
        if any(f["setup"] == setup for f in fws):
            setups[setup] = fn()
            if setups[setup]:
                log(f"skipping the {setup} apps: {setups[setup]}")
    # Again, now that the installs are known (uvicorn's loop and parser).
    chosen = {f["name"] for f in fws}
    fws = [f for f in frameworks() if f["name"] in chosen]

    server = redis_server(binary, module)
    status = 0
    results = {"frameworks": {}}
    loadavg_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    try:
        with server.conn() as c:
            # The first of the two fields INFO lists, as this script has always recorded it.
            server_version = next((v for k, v in c.info("server").items()
                                   if k in ("valkey_version", "redis_version")), "?")  # fmt: skip
            c.call("SET", "bench:get", "v")
        for fw in fws:
            name = fw["name"]
            if setups.get(fw["setup"]):
                results["frameworks"][name] = {"skipped": setups[fw["setup"]]}
                continue
            log(f"{name}: {args.rounds} rounds x {len(ROUTES)} routes x {args.requests} requests")
            try:
                run = bench_framework(fw, server, args.requests, args.rounds, args.warmup)
            except Exception as e:  # noqa: BLE001 - an app that cannot start is skipped
                log(f"{name}: skipped: {e}")
                results["frameworks"][name] = {"skipped": f"did not run: {e}"}
                continue
            found = versions(fw["setup"])
            wanted = fw.get("packages")
            found = {k: v for k, v in found.items() if wanted is None or k.lower() in wanted}
            res = {"server": fw["server"], "versions": found, "per_round": run["per_round"],
                   "summary": summarise(run["per_round"]), "problems": run["problems"]}  # fmt: skip
            for problem in run["problems"]:
                log(f"{name}: WRONG: {problem}")
                status = 1
            results["frameworks"][name] = res
            s = res["summary"]
            log(f"{name}: bare {f1(s['bare'])} µs, +GET {f1(s['get_overhead'])}, +limiter {f1(s['module_overhead'])} "
                f"(ratio {ratio_text(s['ratio']['module'])}), Lua +{f1(s['lua_overhead'])}")  # fmt: skip
        if not args.no_breakdown:
            log("breakdown: GET against take, in process, without HTTP")
            results["breakdown"] = breakdowns(setups, server, args.requests, args.rounds)
    finally:
        server.stop()

    results["meta"] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        # Changes anywhere but in this bench's own output files.
        "git": git_rev(".", ":(exclude)bench/results/middleware-results.*", mark="+changes"),
        "server": f"{Path(binary).name} {server_version}",
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_before": loadavg_before,
        "loadavg_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "requests": args.requests,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "target_ratio": TARGET_RATIO,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    for make in (table, cpu_table):
        head, rows = make(results)
        if not rows:
            continue
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]
        print()
        for row in [head, *rows]:
            print("  ".join(x.ljust(w) for x, w in zip(row, widths)))
    print(f"\nwritten: {out.with_suffix('.md')} and .json")
    return status


if __name__ == "__main__":
    sys.exit(main())

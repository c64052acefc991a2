"""What the bench scripts here share: a RESP2 client, a server started on a
free loopback port with the module loaded, the servers to race on, and the
head, tables and ending of a results file.

Each script measures its own thing; this module holds only the plumbing
around it, so that a fix to the client or to how a server starts reaches
every script at once. Python 3.11 standard library only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"
# Where the scripts write their results by default: generated files apart
# from the scripts that generate them.
RESULTS_DIR = BENCH_DIR / "results"


# --------------------------------------------------------------------------
# RESP2


class ReplyError(Exception):
    pass


class Incomplete(Exception):
    """parse_one: the buffer ends inside a value."""


def encode(args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if not isinstance(arg, bytes):
            arg = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def parse_one(buf: bytes | bytearray, pos: int = 0):
    """One RESP2 value from buf[pos:]: (value, next_pos); Incomplete if cut.
    For bytes that are already here (an AOF file, a non-blocking socket's
    buffer); a Conn reads its own socket as a stream instead."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, rest = buf[pos : pos + 1], bytes(buf[pos + 1 : end])
    pos = end + 2
    if kind == b"+":
        return rest.decode(), pos
    if kind == b"-":
        return ReplyError(rest.decode()), pos
    if kind == b":":
        return int(rest), pos
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise Incomplete
        return bytes(buf[pos : pos + n]), pos + n + 2
    if kind == b"*":
        n = int(rest)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = parse_one(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"bad RESP at {pos}: {bytes(buf[pos - 1 : pos + 20])!r}")


class Conn:
    """A blocking client. It reads its socket as a stream, from a position in
    one buffer, so a long pipeline or a large reply costs no re-parsing and
    no copying per reply: bench.py times calls at the client with it.

    nodelay: TCP_NODELAY, for the scripts that time single small commands
    (btake_bench, handoff_bench). Off by default, as bench.py and
    lease_bench have always measured with it: Nagle's algorithm changes how
    a large pipelined write reaches the server."""

    def __init__(self, port: int, timeout: float = 120.0, nodelay: bool = False):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if nodelay:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pos = 0

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        if self.pos > (1 << 20):
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += chunk

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = bytes(self.buf[self.pos : end])
                self.pos = end + 2
                return line
            self._fill()

    def _exact(self, n: int) -> bytes:
        while len(self.buf) - self.pos < n + 2:
            self._fill()
        data = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n + 2
        return data

    def read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return ReplyError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ConnectionError(f"bad reply line {line!r}")

    def call(self, *args):
        self.sock.sendall(encode(args))
        reply = self.read()
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    def send(self, *commands):
        """Writes the commands in one go; their replies are left to read()."""
        self.sock.sendall(b"".join(encode(c) for c in commands))

    def pipeline(self, commands, chunk: int = 2000, check: bool = True) -> list:
        replies = []
        for i in range(0, len(commands), chunk):
            part = commands[i : i + chunk]
            self.sock.sendall(b"".join(encode(c) for c in part))
            replies.extend(self.read() for _ in part)
        if check:
            errors = [r for r in replies if isinstance(r, ReplyError)]
            if errors:
                raise errors[0]
        return replies

    def info(self, section: str) -> dict:
        text = self.call("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def cpu(self) -> tuple[float, float]:
        """The server's CPU so far, (user, sys) seconds (INFO cpu)."""
        info = self.info("cpu")
        return float(info["used_cpu_user"]), float(info["used_cpu_sys"])


def commandstats(c: Conn) -> dict:
    """INFO commandstats as {command: {field: float}} (calls, usec,
    usec_per_call, failed_calls, ...)."""
    out = {}
    for k, v in c.info("commandstats").items():
        if k.startswith("cmdstat_"):
            out[k[len("cmdstat_") :]] = {kv.split("=")[0]: float(kv.split("=")[1]) for kv in v.split(",")}
    return out


def cpu_seconds(c: Conn) -> float:
    user, sys_ = c.cpu()
    return user + sys_


def version_of(c: Conn) -> str:
    info = c.info("server")
    if "valkey_version" in info:
        return "valkey " + info["valkey_version"]
    return "redis " + info.get("redis_version", "?")


# --------------------------------------------------------------------------
# Servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    """The server did not answer PING: a note for the scripts that race
    several servers, not a failure of the module."""


class Server:
    """A server with the module on a free loopback port, in a temp dir of its
    own, logging to server.log there.

    config: what goes before the modules, by default no persistence;
    btake_bench and handoff_bench give AOF settings and client limits here.
    extra: what goes after them (bench.py's AOF, master and replica).
    peer: a second module loaded beside ours (redis-cell).
    tag: the temp dir's name, by default bench-<name>; anything but letters,
    digits, dots and dashes becomes "_", as a name may be a path.
    port: where a free port comes from (middleware_bench keeps its own)."""

    live: list["Server"] = []

    def __init__(self, binary: str, module: Path, name: str, extra=(), *, config=("--appendonly", "no"),
                 peer: Path | None = None, tag: str | None = None, port: Callable[[], int] = free_port):  # fmt: skip
        self.name = name
        self.binary = binary
        modules = ["--loadmodule", str(module)]
        if peer is not None:
            modules += ["--loadmodule", str(peer)]
        tag = "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in tag or f"bench-{name}")
        self.dir = Path(tempfile.mkdtemp(prefix=f"tb-{tag}-"))
        last = ""
        for _ in range(5):
            self.port = port()
            argv = [
                binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--logfile", str(self.dir / "server.log"),
                "--daemonize", "no", "--save", "", *config,
                "--loglevel", "warning", *modules,
                *extra,
            ]  # fmt: skip
            # Everything the server says goes to its logfile; an unread pipe
            # could only fill up and stall it.
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            Server.live.append(self)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with Conn(self.port, timeout=2) as c:
                        if c.call("PING") == "PONG":
                            return
                except (OSError, ReplyError):
                    time.sleep(0.05)
            last = self.log_tail()
            # Keep the dir: the next try (another port, likely) logs there,
            # and after the last one its log says why.
            self.stop(keep_dir=True)
        raise ServerStartError(f"{name}: server did not start:\n{last}")

    def log_tail(self) -> str:
        try:
            return "\n".join((self.dir / "server.log").read_text().splitlines()[-20:])
        except OSError:
            return ""

    def conn(self) -> Conn:
        return Conn(self.port)

    def stop(self, keep_dir: bool = False):
        if self.proc.poll() is None:
            try:
                with Conn(self.port, timeout=5) as c:
                    c.sock.sendall(encode(("SHUTDOWN", "NOSAVE")))
            except OSError:
                pass
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in Server.live:
            Server.live.remove(self)
        if not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def stop_all():
    for server in list(Server.live):
        server.stop()


@contextlib.contextmanager
def timed_run(results: dict):
    """Around a script's measuring loop: every server still running is
    stopped at the end, also after an error (a stray server would hold its
    port and its memory); after a run that ends normally, how long it took
    and the load average at its end go into `results`."""
    t_start = time.monotonic()
    try:
        yield
    finally:
        stop_all()
    results["seconds"] = time.monotonic() - t_start
    results["loadavg_end"] = os.getloadavg()


def discover_servers(only: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, binary) of every server to race on (Redis from PATH, every
    .cache/servers/valkey-*/valkey-server, TB_BENCH_SERVERS), and notes on
    those skipped. only: a --servers comma list, or None for all."""
    found: list[tuple[str, str]] = []
    notes: list[str] = []
    redis = shutil.which("redis-server")
    if redis:
        found.append(("redis", redis))
    else:
        notes.append("skipping redis: no redis-server in PATH")
    valkeys = sorted((ROOT / ".cache/servers").glob("valkey-*/valkey-server"))
    if not valkeys:
        notes.append("skipping Valkey: none in .cache/servers (bash scripts/fetch-servers.sh)")
    for path in valkeys:
        found.append((path.parent.name, str(path)))
    for raw in os.environ.get("TB_BENCH_SERVERS", "").split(":"):
        if not raw.strip():
            continue
        path = Path(raw.strip()).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            found.append((str(path), str(path.resolve())))
        else:
            notes.append(f"skipping {raw}: not found or not executable (TB_BENCH_SERVERS)")
    seen = set()
    unique = []
    for name, binary in found:
        real = os.path.realpath(binary)
        if real not in seen:
            seen.add(real)
            unique.append((name, binary))
    if not only:
        return unique, notes
    # --servers: exact names (redis, valkey-9.1, a path); a word that names
    # none of them picks every server whose path contains it.
    out = []
    for o in only.split(","):
        exact = [s for s in unique if o in s]
        picked = exact or [s for s in unique if o in s[0] or o in s[1]]
        if not picked:
            notes.append(f"skipping {o}: no such server (--servers)")
        out += [s for s in picked if s not in out]
    return out, notes


def raise_nofile(need: int) -> int:
    """Lifts the soft limit on open files (one socket per waiter) as far as
    the hard limit allows; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------
# Results


def log(msg):
    print(msg, flush=True)


def git_rev(*paths: str, mark: str = "+dirty", untracked: bool = False) -> str:
    """HEAD's short hash, with `mark` when any of `paths` (git pathspecs)
    differ from it. Each script names what its figures depend on, and its
    results files have always carried its own mark."""
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        status = ["git", "-C", str(ROOT), "status", "--porcelain"]
        if not untracked:
            status.append("--untracked-files=no")
        dirty = subprocess.run([*status, "--", *paths], capture_output=True, text=True, check=True).stdout.strip()
        return rev + (mark if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def built_module(path: str) -> Path:
    """The module to load, as an absolute path: the server changes into its
    --dir before it loads modules, so a relative one would not be found."""
    module = Path(path).resolve()
    if not module.exists():
        raise SystemExit(f"{module} not found: cargo build --release")
    return module


def generated_by(script: str, results: dict, timing: bool = False) -> str:
    """The opening of a results file's first paragraph: the command, when,
    the commit, the machine; with `timing`, the load average at the start
    and how long the run took."""
    text = (f"Generated by `{('python3 bench/' + script + ' ' + results['argv']).strip()}` at "
            f"{results['date']} (git {results['git']}), {results['machine']}")  # fmt: skip
    if timing:
        text += (f", load average {', '.join(f'{x:.2f}' for x in results['loadavg_start'])} at the start, "
                 f"{results['seconds']:.0f} s")  # fmt: skip
    return text


def run_head(git: str, module: Path | None = None) -> dict:
    """The first fields of a results file: how the script was called, when,
    at which commit, with which module, on what machine."""
    head = {
        "argv": " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git,
    }
    if module is not None:
        head["module"] = str(module)
    head["machine"] = (f"{platform.machine()}, {os.cpu_count()} cpus, "
                       f"{platform.python_implementation()} {platform.python_version()}")  # fmt: skip
    return head


def finish(results: dict, out: str, write: Callable[[dict, Path], None], files: tuple[str, str],
           failed: bool, tables=(), right: bool = False) -> int:  # fmt: skip
    """Prints the tables (each a function of the results giving head and
    rows), writes the results files into `out` (made if missing) and says
    where; the exit status, 1 only on a correctness failure."""
    for rows in tables:
        print()
        print(text_table(*rows(results), right=right))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write(results, out_dir)
    print(f"\nwrote {out_dir / files[0]} and {out_dir / files[1]} in {results['seconds']:.0f} s")
    if failed:
        print("CORRECTNESS FAILURE (see above)", file=sys.stderr)
        return 1
    return 0


def md_blocks(*blocks: str) -> list[str]:
    """Markdown lines with a blank line after each block (a heading, a
    paragraph, a table), for a results file's "\n".join."""
    return [line for block in blocks for line in (block, "")]


def fmt(x, digits=2):
    """A figure for btake_bench's and handoff_bench's tables: thousands
    separators, integers as integers. (bench.py keeps its plain fixed-point
    fmt, which its results and lease_bench's have always used.)"""
    if x is None:
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.{digits}f}"


def text_table(head, rows, right: bool = False) -> str:
    """Columns padded to their widest cell: left-aligned (bench.py,
    lease_bench) or right-aligned (btake_bench, handoff_bench)."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    pad = str.rjust if right else str.ljust
    line = lambda r: "  ".join(pad(str(x), w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def md_table(head, rows) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(out)

"""Real servers for the tests: redis-server (TB_SERVER) with the module
(TB_MODULE) and without it, on free 127.0.0.1 ports, each in a temp dir,
killed at the end even on failure; and 3-master clusters both ways."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SLOT_RANGES = [(0, 5460), (5461, 10922), (10923, 16383)]


def module_path() -> str:
    path = Path(os.environ.get("TB_MODULE") or REPO / "target/release/libredis_tb.so").resolve()
    if not path.is_file():
        pytest.exit(f"module not found at {path}: run `cargo build --release` or set TB_MODULE", 2)
    return str(path)


def wait_until(what: str, condition, timeout_s: float = 10):
    """Polls `condition` until it holds, failing with `what` after a generous
    `timeout_s`: a loaded machine may take long, a broken limiter never gets there."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.01)


async def await_until(what: str, condition, timeout_s: float = 10):
    """`wait_until` inside an event loop: the loop runs while it polls."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One redis-server process; `module=True` loads the module."""

    def __init__(self, module: bool, extra=(), port=None):
        self.binary = os.environ.get("TB_SERVER", "redis-server")
        self.dir = tempfile.mkdtemp(prefix="tb-py-")
        self.extra = list(extra)
        self.proc = None
        for _ in range(1 if port else 5):  # a free port may be taken before the server binds it
            self.port = port or free_port()
            if self.start(module):
                return
        self.stop()
        raise RuntimeError(f"{self.binary} did not start: see {self.dir}/server.log")

    def start(self, module: bool) -> bool:
        """Start (again) on the same port and dir, with or without the module."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir,
                "--enable-module-command", "yes", *self.extra]
        if module:
            args += ["--loadmodule", module_path()]
        log = open(os.path.join(self.dir, "server.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self._ready()

    def restart(self, module: bool):
        self.kill()
        if not self.start(module):
            raise RuntimeError(f"{self.binary} did not restart: see {self.dir}/server.log")

    def _ready(self) -> bool:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as r:
                    if r.ping():
                        return True
            except redis.RedisError:
                time.sleep(0.02)
        self.proc.kill()
        self.proc.wait()
        return False

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, **kw)

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Three masters owning all slots (as tests/it/topology/cluster.rs builds it)."""

    def __init__(self, module: bool):
        self.nodes = []
        try:
            for _ in range(3):
                bus = free_port()
                self.nodes.append(Server(module, ["--cluster-enabled", "yes", "--cluster-config-file",
                                                  "nodes.conf", "--cluster-port", str(bus),
                                                  "--cluster-node-timeout", "5000"]))
                self.nodes[-1].bus = bus
            for i, (node, (first, last)) in enumerate(zip(self.nodes, SLOT_RANGES)):
                with node.client() as r:
                    r.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                    r.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            with self.nodes[0].client() as r:
                for node in self.nodes[1:]:
                    r.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus)
            self._wait_ok()
        except BaseException:
            self.stop()
            raise

    def _wait_ok(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                with node.client() as r:
                    info = r.execute_command("CLUSTER", "INFO").decode()
                    slots = r.execute_command("CLUSTER", "SLOTS")
                states.append("cluster_state:ok" in info and "cluster_known_nodes:3" in info
                              and len(slots) == 3)
            if all(states):
                return
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    @property
    def port(self):
        return self.nodes[0].port

    def stop(self):
        for node in self.nodes:
            node.stop()


def _running(name, kind, module: bool, scope="function", doc=None):
    """The fixture `name`: a `kind` (Server or Cluster) with or without the
    module, started for `scope` and stopped after it."""

    def fixture():
        running = kind(module=module)
        yield running
        running.stop()

    fixture.__name__ = fixture.__qualname__ = name
    fixture.__doc__ = doc
    return pytest.fixture(scope=scope, name=name)(fixture)


module_server = _running("module_server", Server, True, "session")
plain_server = _running("plain_server", Server, False, "session")
own_server = _running("own_server", Server, False,
                      doc="A server without the module that the test may stop, hang or change.")
own_module_server = _running("own_module_server", Server, True,
                             doc="A server with the module that the test may stop, restart or change.")
module_cluster = _running("module_cluster", Cluster, True, "session")
plain_cluster = _running("plain_cluster", Cluster, False, "session")


# The three ways a limiter runs: (server fixture, backend argument, expected backend).
BACKENDS = {
    "module": ("module_server", "auto", "module"),
    "function": ("plain_server", "auto", "function"),
    "script": ("plain_server", "script", "script"),
}


@pytest.fixture(params=list(BACKENDS))
def setup(request):
    """(server, backend argument, expected backend) for every backend; the
    server is flushed (data, functions, scripts) first."""
    fixture, arg, expected = BACKENDS[request.param]
    server = request.getfixturevalue(fixture)
    with server.client() as r:
        r.flushall()
        r.execute_command("FUNCTION", "FLUSH")
        r.execute_command("SCRIPT", "FLUSH")
    return server, arg, expected


@pytest.fixture
def limiter(setup):
    from redis_tb import RateLimiter

    server, arg, expected = setup
    client = redis.Redis(port=server.port)
    lim = RateLimiter(client, backend=arg)
    assert lim.connect() == expected and lim.backend == expected
    yield lim
    lim.close()
    client.close()


async def aclose(client):
    """`await client.aclose()`; redis-py 5.0.0 only has close()."""
    await (client.aclose() if hasattr(client, "aclose") else client.close())


@contextlib.asynccontextmanager
async def async_limiter(port, backend="auto"):
    """(client, AsyncRateLimiter) on the server at `port`, inside a test's
    asyncio.run (a client belongs to one event loop): both closed at the
    end, also when the test failed."""
    import redis.asyncio as aredis

    from redis_tb import AsyncRateLimiter

    client = aredis.Redis(port=port)
    lim = AsyncRateLimiter(client, backend=backend)
    try:
        yield client, lim
    finally:
        await lim.close()
        await aclose(client)

"""A throwaway redis-server with the redis-tb module, on a free loopback port."""

from __future__ import annotations

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


def module_path() -> str:
    path = Path(
        os.environ.get("TB_MODULE") or HERE / "../../target/release/libredis_tb.so"
    ).resolve()
    if not path.is_file():
        pytest.fail(
            f"module not found at {path} (run `cargo build --release` in the "
            "repository root, or set TB_MODULE)",
            pytrace=False,
        )
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.dir = tempfile.mkdtemp(prefix="tb-py-")
        binary = os.environ.get("REDIS_SERVER", "redis-server")
        module = module_path()
        # A port free when picked may be taken before the server binds it: retry.
        for _ in range(5):
            self.port = _free_port()
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--loadmodule", module, "--save", "", "--appendonly", "no",
                 "--dir", self.dir],
                stdout=subprocess.DEVNULL,
            )
            if self._wait_ready():
                return
        self.stop()
        raise RuntimeError(f"redis-server with {module} did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as r:
                    if r.ping():
                        return True
            except redis.ConnectionError:
                time.sleep(0.02)
        self.proc.kill()
        self.proc.wait()
        return False

    def pause(self):
        """SIGSTOP: the server keeps its connections but answers nothing."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.send_signal(signal.SIGCONT)  # in case it was paused
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    s = RedisServer()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def own_server():
    """A server of the test's own, which it may stop."""
    s = RedisServer()
    try:
        yield s
    finally:
        s.stop()
